"""Write operations on jobs and attempts (imported as `job_writes`, never aliased). Each
runs inside the writer's open transaction on the raw sqlite3 connection, checks the
transition table, and appends its event rows.

An operation that raises is rolled back with its batch, and the batch is replayed without
it (writer.py), so it never leaves half its writes behind.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from noduslocal.daemon.store.rows import JOB_COLUMNS, job_from_row
from noduslocal.domain import errors
from noduslocal.domain.jobs import (
    Collected,
    CreateRequest,
    Event,
    Handle,
    JobRecord,
    JobSpec,
    Owner,
    handles_to_json,
)
from noduslocal.domain.states import (
    ATTEMPT_TRANSITIONS,
    TERMINAL,
    TRANSITIONS,
    AttemptPhase,
    Phase,
    Reason,
    check_attempt_transition,
    check_transition,
)


@dataclass
class Created:
    job: JobRecord
    created: bool  # False: the idempotency key named an existing job


def _event(conn: sqlite3.Connection, job: tuple[int, str, str], at: float, phase: str,
           reason: str | None, message: str | None, attempt: int | None) -> Event:
    return _events(conn, job, [(at, phase, reason, message, attempt)])[0]


def _events(conn: sqlite3.Connection, job: tuple[int, str, str],
            rows: list[tuple[float, str, str | None, str | None, int | None]]) -> list[Event]:
    """Several event rows of one job in one statement: (at, phase, reason, message,
    attempt) each. One INSERT numbers its rows one after another, so the last one's seq
    gives the others'."""
    values = [v for at, phase, reason, message, attempt in rows
              for v in (job[0], at, phase, reason, message, attempt)]
    cur = conn.execute("INSERT INTO events (job_id, at, phase, reason, message, attempt) "
                       f"VALUES {', '.join(['(?,?,?,?,?,?)'] * len(rows))}", values)
    last = cur.lastrowid or 0
    return [Event(last - len(rows) + 1 + i, job[0], job[1], job[2], *row)
            for i, row in enumerate(rows)]


def next_job_id(conn: sqlite3.Connection) -> int:
    """The next job id: above every job the database knows and above the floor, the
    highest job directory on disk when the daemon started (job_id_floor)."""
    return int(conn.execute(
        "SELECT MAX(COALESCE((SELECT MAX(id) FROM jobs), 0), "
        "(SELECT COALESCE(MAX(floor), 0) FROM job_id_floor)) + 1").fetchone()[0])


def raise_job_id_floor(conn: sqlite3.Connection, floor: int) -> tuple[None, list[Event]]:
    conn.execute("UPDATE job_id_floor SET floor = MAX(floor, ?)", (floor,))
    return None, []


@dataclass(frozen=True)
class Expr:
    """A column's new value as SQL over its old one (`attempts + 1`), with its parameters:
    the update computes it, so no SELECT reads the row first."""

    sql: str
    params: tuple[Any, ...] = ()


def _assignments(columns: dict[str, Any]) -> tuple[str, list[Any]]:
    sql, params = [], []
    for col, value in columns.items():
        if isinstance(value, Expr):
            sql.append(f", {col} = {value.sql}")
            params.extend(value.params)
        else:
            sql.append(f", {col} = ?")
            params.append(value)
    return "".join(sql), params


def _sources(table: dict[Any, frozenset[Any]]) -> dict[Any, str]:
    """For each target phase, the phases it may be reached from, as an SQL list: the
    update's WHERE checks the transition table, so a legal one costs no SELECT."""
    return {target: ", ".join(sorted(f"'{p.value}'" for p, to in table.items()
                                     if target in to)) or "NULL"
            for target in table}


_JOB_SOURCES = _sources(TRANSITIONS)
_ATTEMPT_SOURCES = _sources(ATTEMPT_TRANSITIONS)


def _transition(conn: sqlite3.Connection, job_id: int, target: Phase, at: float,
                reason: str | None, message: str | None = None, attempt: int | None = None,
                **columns: Any) -> Event:
    """The job to `target` with its event; `columns` set beside (an Expr computed from the
    row). NotFound or IllegalTransition, and nothing written, when it may not."""
    project, name, _ = _update_job(conn, job_id, target, reason, message, **columns)
    return _event(conn, (job_id, project, name), at, target.value, reason, message, attempt)


def _update_job(conn: sqlite3.Connection, job_id: int, target: Phase, reason: str | None,
                message: str | None, via: Phase | None = None,
                **columns: Any) -> tuple[str, str, int]:
    """The job's row to `target`: one UPDATE when the transition is legal (its WHERE
    checks the table); returns the row's project, name and attempts after it. `via`: a
    phase passed through on the way, in the same write (legal to `target`: the caller
    checked), so the row must be in one it may be reached from."""
    sets, params = _assignments(columns)
    rows = conn.execute(
        f"UPDATE jobs SET phase = ?, reason = ?, message = ?{sets} WHERE id = ? "
        f"AND phase IN ({_JOB_SOURCES[via or target]}) RETURNING project, name, attempts",
        (target.value, reason, message, *params, job_id)).fetchall()
    if not rows:
        row = conn.execute("SELECT phase FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise errors.NotFound(f"job {job_id} does not exist")
        check_transition(row[0], via or target)
        raise AssertionError(f"job {job_id}: {row[0]} -> {target} was not written")
    return rows[0]


def _attempt_to(conn: sqlite3.Connection, job_id: int, number: int, target: AttemptPhase,
                via: AttemptPhase | None = None, **columns: Any) -> None:
    """The attempt's row to `target` (`via`: as _update_job's)."""
    sets, params = _assignments(columns)
    cur = conn.execute(
        f"UPDATE attempts SET phase = ?{sets} WHERE job_id = ? AND number = ? "
        f"AND phase IN ({_ATTEMPT_SOURCES[via or target]})",
        (target.value, *params, job_id, number))
    if cur.rowcount == 1:
        return
    row = conn.execute("SELECT phase FROM attempts WHERE job_id = ? AND number = ?",
                       (job_id, number)).fetchone()
    if row is None:
        raise errors.NotFound(f"attempt {number} of job {job_id} does not exist")
    check_attempt_transition(row[0], via or target)
    raise AssertionError(f"attempt {number} of job {job_id}: {row[0]} -> {target} was not "
                         "written")


def insert_job(conn: sqlite3.Connection, req: CreateRequest, owner: Owner, name: str,
               project: str, now: float, idempotency_key: str | None,
               request_hash: str | None) -> tuple[Created, list[Event]]:
    if idempotency_key is not None:
        row = conn.execute(
            f"SELECT {JOB_COLUMNS}, request_hash FROM jobs "
            "WHERE owner_uid = ? AND idempotency_key = ?",
            (owner.uid, idempotency_key),
        ).fetchone()
        if row is not None:
            if row[-1] != request_hash:
                raise errors.Conflict(
                    f"idempotency key {idempotency_key!r} was used for a different request "
                    f"(job {row[2]!r})"
                )
            return Created(job_from_row(row[:-1]), created=False), []
    if conn.execute("SELECT 1 FROM jobs WHERE project = ? AND name = ?",
                    (project, name)).fetchone():
        raise errors.AlreadyExists(f"name: job {name!r} already exists in project {project!r}",
                                   field="name")
    job_id = next_job_id(conn)
    spec = resolve_after(conn, req.spec, owner, project, implicit=req.project is None)
    conn.execute(
        "INSERT INTO jobs (id, project, name, owner_uid, owner_gid, owner, phase, reason, "
        "spec, labels, idempotency_key, request_hash, created_at) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (job_id, project, name, owner.uid, owner.gid, owner.name, Phase.PENDING.value,
         Reason.CREATED.value, json.dumps(spec.to_wire()), json.dumps(req.labels),
         idempotency_key, request_hash, now),
    )
    insert_refs(conn, [job_id], resolve_refs(conn, req, owner), req.spec)
    event = _event(conn, (job_id, project, name), now, Phase.PENDING.value,
                   Reason.CREATED.value, None, None)
    job = JobRecord(id=job_id, project=project, name=name, owner_uid=owner.uid,
                    owner_gid=owner.gid, owner=owner.name, phase=Phase.PENDING.value,
                    spec=spec, labels=req.labels, created_at=now,
                    reason=Reason.CREATED.value)
    return Created(job, created=True), [event]


def resolve_after(conn: sqlite3.Connection, spec: JobSpec, owner: Owner, project: str,
                  implicit: bool) -> JobSpec:
    """SPEC with each of its `after` resolved to the id of the job (or sweep) of that name
    now, or InvalidArgument naming `after`. A name without a project is looked up in the
    new job's project; when that project is the caller's own (none was named), a job
    there of another owner is not found, as lookups by name never find one by accident.
    Any job or sweep named with its project may be depended on: every user may read every
    job's state (the API's listings show them all). No cycle can form: only jobs stored
    before this one can be named, and by id, so a dependency always points backwards."""
    if not spec.after:
        return spec
    resolved = []
    for dep in spec.after:
        where = dep.project or project
        table = "sweeps" if dep.sweep else "jobs"
        row = conn.execute(f"SELECT id, owner_uid, owner FROM {table} "
                           "WHERE project = ? AND name = ?", (where, dep.name)).fetchone()
        if row is None or (dep.project is None and implicit and row[1] != owner.uid):
            mine = " among yours" if row is not None else ""
            raise errors.InvalidArgument(
                f"after: there is no {'sweep' if dep.sweep else 'job'} {dep.name!r}{mine} "
                f"in project {where!r} to wait for", field="after")
        resolved.append(dep.resolved(where, int(row[0])))
    return replace(spec, after=resolved)


def resolve_refs(conn: sqlite3.Connection, req: CreateRequest,
                 owner: Owner) -> list[tuple[str, str]]:
    """Check what a job names (its secrets, source and volumes) before it is stored;
    returns each secret's (env, value)."""
    secrets = []
    for ref in req.secrets:
        value = ref.value
        if value is None:
            row = conn.execute("SELECT value FROM secrets WHERE owner_uid = ? AND name = ?",
                               (owner.uid, ref.name)).fetchone()
            if row is None:
                raise errors.InvalidArgument(
                    f"secrets: you have no secret named {ref.name!r}; set it with "
                    f"`noduslocal secret set {ref.name}`", field="secrets")
            value = row[0]
        secrets.append((ref.env, value))
    if req.spec.source is not None and not conn.execute(
            "SELECT 1 FROM sources WHERE sha256 = ? AND owner_uid = ?",
            (req.spec.source, owner.uid)).fetchone():
        raise errors.InvalidArgument(f"source: you have uploaded no source {req.spec.source}",
                                     field="source")
    for volume in req.spec.volumes.values():
        row = conn.execute("SELECT owner_uid, owner FROM volumes WHERE name = ?",
                           (volume,)).fetchone()
        if row is None:
            raise errors.InvalidArgument(
                f"volumes: there is no volume {volume!r}; create it with "
                f"`noduslocal volume create {volume}`", field="volumes")
        if row[0] != owner.uid and not owner.admin:
            raise errors.PermissionDenied(f"volumes: volume {volume!r} belongs to {row[1]}")
    return secrets


def insert_refs(conn: sqlite3.Connection, job_ids: list[int], secrets: list[tuple[str, str]],
                spec: JobSpec) -> None:
    """The secrets and volumes of jobs just inserted (resolve_refs checked them)."""
    conn.executemany("INSERT INTO job_secrets (job_id, env, value) VALUES (?,?,?)",
                     [(job_id, env, value) for job_id in job_ids for env, value in secrets])
    conn.executemany("INSERT INTO job_volumes (job_id, path, volume) VALUES (?,?,?)",
                     [(job_id, path, volume) for job_id in job_ids
                      for path, volume in spec.volumes.items()])


def start_attempt(conn: sqlite3.Connection, job_id: int, now: float,
                  gpus: list[str] | None = None) -> tuple[int, list[Event]]:
    """Pending -> Starting with a new attempt row (and the GPUs it was given); returns the
    attempt number."""
    project, name, number = _update_job(conn, job_id, Phase.STARTING, Reason.SCHEDULED.value,
                                        None, attempts=Expr("attempts + 1"))
    event = _event(conn, (job_id, project, name), now, Phase.STARTING.value,
                   Reason.SCHEDULED.value, None, number)
    conn.execute("INSERT INTO attempts (job_id, number, phase, created_at, gpus) "
                 "VALUES (?,?,?,?,?)", (job_id, number, AttemptPhase.STARTING.value, now,
                                        json.dumps(gpus) if gpus else None))
    return number, [event]


def attempt_queued(conn: sqlite3.Connection, job_id: int, number: int, now: float,
                   handles: list[Handle], message: str) -> tuple[None, list[Event]]:
    """Starting -> Pending with the attempt left open (Starting) and its handles kept: a
    cluster's scheduler queued it, and a restarted daemon finds it there by them."""
    conn.execute("UPDATE attempts SET handles = ? WHERE job_id = ? AND number = ?",
                 (handles_to_json(handles), job_id, number))
    return None, [_transition(conn, job_id, Phase.PENDING, now, Reason.QUEUED.value, message,
                              attempt=number)]


def attempt_running(conn: sqlite3.Connection, job_id: int, number: int, now: float,
                    handles: list[Handle] | None = None) -> tuple[None, list[Event]]:
    """Starting -> Running, with each rank's handle so a restarted daemon finds them."""
    _attempt_to(conn, job_id, number, AttemptPhase.RUNNING, started_at=now,
                handles=handles_to_json(handles or []))
    return None, [_transition(conn, job_id, Phase.RUNNING, now, Reason.STARTED.value,
                              attempt=number,
                              started_at=Expr("COALESCE(NULLIF(started_at, 0), ?)", (now,)))]


def request_stop(conn: sqlite3.Connection, job_id: int, number: int,
                 reason: str) -> tuple[None, list[Event]]:
    """Remember why we are stopping a running attempt, so its exit is read correctly even
    after a daemon restart. The first reason wins (a timeout is not turned into a cancel),
    except as outcomes.overrides() says (a cancel over a suspend, a suspend over a
    preemption)."""
    conn.execute(
        "UPDATE attempts SET stop_reason = CASE WHEN stop_reason IS NULL OR "
        "(? = 'Cancelled' AND stop_reason IN ('Suspended', 'Preempted')) OR "
        "(? = 'Suspended' AND stop_reason = 'Preempted') THEN ? "
        "ELSE stop_reason END WHERE job_id = ? AND number = ?",
        (reason, reason, reason, job_id, number),
    )
    return None, []


def set_phase(conn: sqlite3.Connection, job_id: int, phase: Phase, now: float, reason: str,
              message: str, expect: Phase | None = None) -> tuple[None, list[Event]]:
    """A job with no attempt running: Pending or Suspended to Suspended, Pending or
    Cancelled (the table in domain/states.py decides). With `expect`, only from that phase: a
    resume and a cancel that race cannot both win."""
    if expect is not None:
        row = conn.execute("SELECT phase, name FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None or row[0] != expect:
            raise errors.Conflict(f"job {row[1] if row else job_id!r} is "
                                  f"{row[0] if row else 'gone'}, no longer {expect}")
    columns: dict[str, Any] = {"ended_at": now} if phase in TERMINAL else {}
    return None, [_transition(conn, job_id, phase, now, reason, message, **columns)]


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, as the runtime observed it."""

    attempt_phase: AttemptPhase
    job_phase: Phase
    reason: str
    message: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    spend_retry: bool = False
    cost: float = 0.0  # what the attempt's GPUs cost


def record_outputs(conn: sqlite3.Connection, job_id: int, number: int,
                   outputs: Sequence[Collected], now: float) -> tuple[None, list[Event]]:
    """Outputs collected from an attempt; an indexed job's as each index ends, each
    replacing what an earlier attempt of that index left."""
    for out in outputs:
        conn.execute(
            "INSERT OR REPLACE INTO outputs (job_id, name, idx, attempt, path, kind, size, "
            "sha256, collected_at, skipped, mode) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (job_id, out.name, out.index, number, out.path, out.kind, out.size, out.sha256,
             now, out.skipped, out.mode))
    return None, []


@dataclass(frozen=True)
class Started:
    """An attempt's Running not written yet (attempt_running's arguments), written with its
    end instead (finish_attempt's `started`)."""

    at: float
    handles: list[Handle] | None = None


def may_end_running(outcome: Outcome) -> bool:
    """Whether an attempt that is Running may end as OUTCOME says, its job with it: then
    its Running may be written in the same write as its end (finish_attempt's `started`)."""
    return (outcome.attempt_phase in ATTEMPT_TRANSITIONS[AttemptPhase.RUNNING]
            and outcome.job_phase in TRANSITIONS[Phase.RUNNING])


def finish_attempt(conn: sqlite3.Connection, job_id: int, number: int, outcome: Outcome,
                   now: float, outputs: Sequence[Collected] = (),
                   metrics: dict[str, float] | None = None,
                   indexed: bool = False,
                   stderr_line: str | None = None,
                   started: Started | None = None) -> tuple[None, list[Event]]:
    """The attempt's end, the job's transition, and the outputs collected from it, in one
    transaction. An attempt that exited replaces every output of an earlier one, so what is
    listed is always one attempt's. `stderr_line`: the last line of its stderr, which a
    sweep's failures are clustered by (None: not read, the clusters read the file).
    `started`: its Running (may_end_running() said so) goes in the same rows, with its own
    event before the end's: a short task's Running and end cost two UPDATEs and one
    INSERT, not five statements (issue 25, part 5)."""
    if outcome.attempt_phase == AttemptPhase.EXITED and not indexed and number > 1:
        # Only an earlier attempt leaves outputs to replace (an indexed job's stay).
        conn.execute("DELETE FROM outputs WHERE job_id = ?", (job_id,))
    record_outputs(conn, job_id, number, outputs, now)
    attempt_columns: dict[str, Any] = {}
    job_columns: dict[str, Any] = {}
    via_attempt, via_job, events = None, None, []
    if started is not None:  # what attempt_running() would have written, here
        attempt_columns = {"started_at": started.at,
                           "handles": handles_to_json(started.handles or [])}
        job_columns = {"started_at": Expr("COALESCE(NULLIF(started_at, 0), ?)",
                                          (started.at,))}
        via_attempt, via_job = AttemptPhase.RUNNING, Phase.RUNNING
        events = [(started.at, Phase.RUNNING.value, Reason.STARTED.value, None, number)]
    _attempt_to(conn, job_id, number, outcome.attempt_phase, via=via_attempt,
                **attempt_columns, ended_at=now, exit_code=outcome.exit_code,
                signal=outcome.signal, reason=outcome.reason, message=outcome.message,
                cost=outcome.cost or None, stderr_line=stderr_line)
    if outcome.cost:
        conn.execute("UPDATE jobs SET cost = cost + ? WHERE id = ?", (outcome.cost, job_id))
    columns: dict[str, Any] = {**job_columns, "exit_code": outcome.exit_code,
                               "signal": outcome.signal}
    if metrics:
        columns["metrics"] = json.dumps(metrics)
    if outcome.job_phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED):
        columns["ended_at"] = now
    if outcome.spend_retry:
        columns["retries_used"] = Expr("retries_used + 1")
    project, name, _ = _update_job(conn, job_id, outcome.job_phase, outcome.reason,
                                   outcome.message, via=via_job, **columns)
    return None, _events(conn, (job_id, project, name), [
        *events, (now, outcome.job_phase.value, outcome.reason, outcome.message, number)])


def remove_job(conn: sqlite3.Connection, job_id: int, now: float,
               by: str) -> tuple[None, list[Event]]:
    """An ended job leaves listings and frees its name: renamed `NAME~ID` (no valid name
    has a '~'); its attempts stay for fair share, its outputs go with its directory."""
    row = conn.execute("SELECT phase, project, name FROM jobs WHERE id = ?",
                       (job_id,)).fetchone()
    if row[0] not in {p.value for p in TERMINAL}:
        raise errors.Conflict(f"job {row[2]!r} is {row[0]}; cancel it first (`job kill`)")
    conn.execute("UPDATE jobs SET name = name || '~' || id, removed_at = ? WHERE id = ?",
                 (now, job_id))
    conn.execute("DELETE FROM outputs WHERE job_id = ?", (job_id,))
    return None, [_event(conn, (job_id, row[1], f"{row[2]}~{job_id}"), now, row[0],
                         Reason.REMOVED, f"removed by {by}; the name {row[2]!r} is free",
                         None)]


def cancel_pending(conn: sqlite3.Connection, job_id: int, now: float,
                   message: str) -> tuple[None, list[Event]]:
    return None, [_transition(conn, job_id, Phase.CANCELLED, now, Reason.CANCELLED.value,
                              message, ended_at=now)]



def never_satisfied(conn: sqlite3.Connection, job_id: int, now: float,
                    message: str) -> tuple[bool, list[Event]]:
    """A job still waiting for its dependencies (Pending, no attempt) ends Cancelled with
    DependencyNeverSatisfied; False (and nothing written) when it is no longer Pending
    (its owner cancelled or suspended it meanwhile)."""
    row = conn.execute("SELECT phase FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None or row[0] != Phase.PENDING:
        return False, []
    return True, [_transition(conn, job_id, Phase.CANCELLED, now,
                              Reason.DEPENDENCY_NEVER_SATISFIED.value, message,
                              ended_at=now)]


def fail_job(conn: sqlite3.Connection, job_id: int, now: float, reason: str,
             message: str) -> tuple[None, list[Event]]:
    """End a job that never got an attempt running (Pending or Starting) as Failed."""
    return None, [_transition(conn, job_id, Phase.FAILED, now, reason, message,
                              ended_at=now)]
