"""The store's operations on sweeps: creating one with all its cells (a job each) in one
transaction, the sweep's own transitions with their event rows, cancelling the cells it
has not started, and removing an ended sweep (`sweep rm`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from noduslocal.daemon.store.job_writes import (
    Owner,
    _event,
    _transition,
    insert_refs,
    next_job_id,
    resolve_after,
    resolve_refs,
)
from noduslocal.domain import errors
from noduslocal.domain.jobs import CreateRequest, Event, JobSpec
from noduslocal.domain.states import (
    SWEEP_TERMINAL,
    TERMINAL,
    Phase,
    Reason,
    SweepPhase,
    check_sweep_transition,
)
from noduslocal.domain.sweep_plan import SMOKE_SUFFIX
from noduslocal.domain.sweeps import SweepRecord, SweepSpec

SWEEP_COLUMNS = ("id, project, name, owner_uid, owner_gid, owner, phase, spec, labels, cells, "
                 "max_parallel, created_at, reason, message, ended_at, freed_at")
SWEEP_LABEL = "sweep"  # every cell carries its sweep's name under this label


def sweep_from_row(row: tuple[Any, ...]) -> SweepRecord:
    return SweepRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6],
                       SweepSpec.from_wire(json.loads(row[7])), json.loads(row[8]), row[9],
                       row[10], row[11],
                       row[12], row[13], row[14], row[15])


@dataclass
class CreatedSweep:
    sweep: SweepRecord
    created: bool  # False: the idempotency key named an existing sweep
    first_job: int = 0  # cells are jobs first_job .. first_job + cells - 1, in cell order
    smoke_job: int | None = None  # the smoke canary's job (no cell of the sweep)


def insert_sweep(conn: sqlite3.Connection, template: CreateRequest, spec: SweepSpec,
                 cells: int, cell_wire: Callable[[int], dict[str, Any]], max_parallel: int,
                 owner: Owner, name: str, project: str, now: float,
                 idempotency_key: str | None, request_hash: str | None,
                 smoke: JobSpec | None = None) -> tuple[CreatedSweep, list[Event]]:
    if idempotency_key is not None:
        row = conn.execute(f"SELECT {SWEEP_COLUMNS}, request_hash FROM sweeps "
                           "WHERE owner_uid = ? AND idempotency_key = ?",
                           (owner.uid, idempotency_key)).fetchone()
        if row is not None:
            if row[-1] != request_hash:
                raise errors.Conflict(f"idempotency key {idempotency_key!r} was used for a "
                                      f"different request (sweep {row[2]!r})")
            return CreatedSweep(sweep_from_row(row[:-1]), created=False), []
    if conn.execute("SELECT 1 FROM sweeps WHERE project = ? AND name = ?",
                    (project, name)).fetchone():
        raise errors.AlreadyExists(f"name: sweep {name!r} already exists in project "
                                   f"{project!r}", field="name")
    if (clash := _first_clash(conn, project, name, cells)) is not None:
        raise errors.AlreadyExists(f"name: job {clash!r} already exists in project "
                                   f"{project!r}; name the sweep otherwise", field="name")
    secrets = resolve_refs(conn, template, owner)
    # Resolved before the sweep is stored, so it can never name itself or its own cells.
    after = resolve_after(conn, template.spec, owner, project,
                          implicit=project == owner.name).after
    spec = replace(spec, template=replace(spec.template, after=after))
    labels = {**template.labels, SWEEP_LABEL: name}
    cur = conn.execute(
        "INSERT INTO sweeps (project, name, owner_uid, owner_gid, owner, phase, reason, spec, "
        "labels, cells, max_parallel, idempotency_key, request_hash, created_at) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (project, name, owner.uid, owner.gid, owner.name, SweepPhase.PENDING.value,
         Reason.CREATED.value, json.dumps(spec.to_wire()), json.dumps(template.labels), cells,
         max_parallel, idempotency_key, request_hash, now))
    sweep_id = cur.lastrowid or 0
    first = next_job_id(conn)
    labels_json = json.dumps(labels)
    after_wire = [dep.to_wire() for dep in after]

    def stored(i: int) -> str:
        # The resolved `after` into each cell's wire form, not into a copy of its spec: a
        # second dataclass replace a cell was a sixth of a 1,000-cell creation.
        wire = cell_wire(i)
        wire["after"] = after_wire
        return json.dumps(wire)

    conn.executemany(
        "INSERT INTO jobs (id, project, name, owner_uid, owner_gid, owner, phase, reason, "
        "spec, labels, created_at, sweep_id, cell) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        ((first + i, project, f"{name}-{i}", owner.uid, owner.gid, owner.name,
          Phase.PENDING.value, Reason.CREATED.value, stored(i),
          labels_json, now, sweep_id, i) for i in range(cells)))
    ids = list(range(first, first + cells))
    insert_refs(conn, ids, secrets, template.spec)
    seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
    conn.executemany(
        "INSERT INTO events (job_id, at, phase, reason) VALUES (?,?,?,?)",
        ((job_id, now, Phase.PENDING.value, Reason.CREATED.value) for job_id in ids))
    events = [Event(seq + 1 + i, first + i, project, f"{name}-{i}", now, Phase.PENDING.value,
                    Reason.CREATED.value, None, None) for i in range(cells)]
    sweep_event(conn, sweep_id, now, SweepPhase.PENDING, Reason.CREATED, None)
    smoke_id = None
    if smoke is not None:
        smoke_id = first + cells
        smoke_name = f"{name}-{SMOKE_SUFFIX}"
        if conn.execute("SELECT 1 FROM jobs WHERE project = ? AND name = ?",
                        (project, smoke_name)).fetchone():
            raise errors.AlreadyExists(f"name: job {smoke_name!r} already exists in project "
                                       f"{project!r}; name the sweep otherwise", field="name")
        conn.execute(
            "INSERT INTO jobs (id, project, name, owner_uid, owner_gid, owner, phase, reason, "
            "spec, labels, created_at, canary_of) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (smoke_id, project, smoke_name, owner.uid, owner.gid, owner.name,
             Phase.PENDING.value, Reason.CREATED.value,
             json.dumps(replace(smoke, after=after).to_wire()),
             labels_json, now, sweep_id))
        insert_refs(conn, [smoke_id], secrets, template.spec)
        events.append(_event(conn, (smoke_id, project, smoke_name), now,
                             Phase.PENDING.value, Reason.CREATED.value, None, None))
        spec = replace(spec, smoke_job=smoke_id)
        conn.execute("UPDATE sweeps SET spec = ? WHERE id = ?",
                     (json.dumps(spec.to_wire()), sweep_id))
    sweep = SweepRecord(sweep_id, project, name, owner.uid, owner.gid, owner.name,
                        SweepPhase.PENDING.value, spec, template.labels, cells, max_parallel,
                        now, Reason.CREATED.value)
    return CreatedSweep(sweep, True, first, smoke_id), events


def _first_clash(conn: sqlite3.Connection, project: str, name: str, cells: int) -> str | None:
    """A job whose name a cell would take (`<sweep>-<index>`). Names are [a-z0-9-], so the
    prefix is compared as text (no LIKE: it folds case and reads `_` and `%`)."""
    prefix = f"{name}-"
    for (taken,) in conn.execute(
            "SELECT name FROM jobs WHERE project = ? AND name > ? AND name < ?",
            (project, prefix, prefix + "\U0010ffff")):
        suffix = taken[len(prefix):]
        if suffix.isdigit() and str(int(suffix)) == suffix and int(suffix) < cells:
            return str(taken)
    return None


def sweep_event(conn: sqlite3.Connection, sweep_id: int, at: float, phase: SweepPhase,
                reason: str | None, message: str | None) -> None:
    conn.execute("INSERT INTO sweep_events (sweep_id, at, phase, reason, message) "
                 "VALUES (?,?,?,?,?)", (sweep_id, at, phase.value, reason, message))


def set_sweep_phase(conn: sqlite3.Connection, sweep_id: int, phase: SweepPhase, now: float,
                    reason: str, message: str | None = None,
                    expect: SweepPhase | None = None) -> tuple[bool, list[Event]]:
    """The sweep's transition with its event row; False (nothing written) when `expect` is
    given and the sweep is no longer in that phase."""
    row = conn.execute("SELECT phase FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
    if row is None:
        raise errors.NotFound(f"sweep {sweep_id} does not exist")
    if expect is not None and row[0] != expect:
        return False, []
    check_sweep_transition(row[0], phase)
    ended = now if phase in (SweepPhase.SUCCEEDED, SweepPhase.FAILED,
                             SweepPhase.CANCELLED) else None
    conn.execute("UPDATE sweeps SET phase = ?, reason = ?, message = ?, ended_at = ? "
                 "WHERE id = ?", (phase.value, reason, message, ended, sweep_id))
    sweep_event(conn, sweep_id, now, phase, reason, message)
    return True, []


def set_max_parallel(conn: sqlite3.Connection, sweep_id: int,
                     max_parallel: int) -> tuple[None, list[Event]]:
    conn.execute("UPDATE sweeps SET max_parallel = ? WHERE id = ?", (max_parallel, sweep_id))
    return None, []


def move_sweep(conn: sqlite3.Connection, sweep_id: int, phase: SweepPhase, now: float,
               reason: str, message: str | None, expect: SweepPhase,
               cancel: tuple[list[int], str, str] | None = None,
               resume: list[int] | None = None) -> tuple[bool, list[Event]]:
    """set_sweep_phase and, in the same transaction, with `cancel` (cells, reason, message)
    those cells cancelled (the ones still Pending or Suspended), with `resume` those jobs
    (the ones still Suspended) Pending again."""
    applied, _ = set_sweep_phase(conn, sweep_id, phase, now, reason, message, expect=expect)
    if not applied:
        return False, []
    events: list[Event] = []
    if cancel is not None:
        cells, cell_reason, cell_message = cancel
        events += cancel_cells(conn, cells, now, cell_reason, cell_message)[1]
    if resume:
        events += resume_jobs(conn, resume, now)[1]
    return True, events


def resume_jobs(conn: sqlite3.Connection, job_ids: list[int],
                now: float) -> tuple[list[int], list[Event]]:
    """Those of the jobs still Suspended, Pending again (their sweep was resumed)."""
    resumed, events = [], []
    for job_id in job_ids:
        row = conn.execute("SELECT phase FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is not None and row[0] == Phase.SUSPENDED:
            events.append(_transition(conn, job_id, Phase.PENDING, now, Reason.RESUMED,
                                      "its sweep was resumed"))
            resumed.append(job_id)
    return resumed, events


def mark_freed(conn: sqlite3.Connection, sweep_id: int,
               now: float) -> tuple[None, list[Event]]:
    conn.execute("UPDATE sweeps SET freed_at = ? WHERE id = ?", (now, sweep_id))
    return None, []


@dataclass
class RetriedCells:
    job_ids: list[int]  # the new jobs, in cell order
    canary: int | None  # the new job of cell 0 when the canary had failed: it runs first


def retry_cells(conn: sqlite3.Connection, sweep_id: int, include_cancelled: bool,
                now: float) -> tuple[RetriedCells, list[Event]]:
    """A new job for each failed cell (and each cancelled one with `include_cancelled`, and
    every cell a failed canary cancelled), named `<sweep>-<index>-r<try>`; the old jobs
    stay as history. The sweep goes back to Canary (after a canary failure) or Running."""
    row = conn.execute("SELECT phase, reason, name FROM sweeps WHERE id = ? "
                       "AND removed_at IS NULL", (sweep_id,)).fetchone()
    if row is None:
        raise errors.NotFound(f"sweep {sweep_id} does not exist")
    phase, reason, sweep_name = row
    if phase != SweepPhase.FAILED:
        raise errors.Conflict(f"sweep {sweep_name!r} is {phase}; only a Failed sweep is "
                              "retried")
    cells = [r for r in conn.execute(
        "SELECT id, cell, phase, reason, project FROM jobs WHERE sweep_id = ? "
        "AND superseded_by IS NULL AND phase IN ('Failed', 'Cancelled') ORDER BY cell",
        (sweep_id,)) if r[2] == Phase.FAILED or include_cancelled
        or r[3] == Reason.CANARY_FAILED]
    if not cells:
        raise errors.Conflict(f"sweep {sweep_name!r} has no failed cell to retry"
                              + ("" if include_cancelled else " (--all: cancelled ones too)"))
    _require_sources(conn, sweep_name, [r[0] for r in cells])
    first = next_job_id(conn)
    ids, events, canary = [], [], None
    for new, (old, cell, _, _, project) in enumerate(cells, first):
        tries = conn.execute("SELECT COUNT(*) FROM jobs WHERE sweep_id = ? AND cell = ?",
                             (sweep_id, cell)).fetchone()[0]
        name = f"{sweep_name}-{cell}-r{tries + 1}"
        if conn.execute("SELECT 1 FROM jobs WHERE project = ? AND name = ?",
                        (project, name)).fetchone():
            raise errors.AlreadyExists(f"name: job {name!r} already exists in project "
                                       f"{project!r}; rename it to retry cell {cell}")
        conn.execute(
            "INSERT INTO jobs (id, project, name, owner_uid, owner_gid, owner, phase, reason, "
            "message, spec, labels, created_at, sweep_id, cell) SELECT ?, project, ?, "
            "owner_uid, owner_gid, owner, ?, ?, ?, spec, labels, ?, sweep_id, cell "
            "FROM jobs WHERE id = ?", (new, name, Phase.PENDING.value, Reason.RETRIED.value,
                                       f"retry of {sweep_name}-{cell}", now, old))
        for table, columns in (("job_secrets", "env, value"), ("job_volumes", "path, volume")):
            conn.execute(f"INSERT INTO {table} (job_id, {columns}) SELECT ?, {columns} "
                         f"FROM {table} WHERE job_id = ?", (new, old))
        conn.execute("UPDATE jobs SET superseded_by = ? WHERE id = ?", (new, old))
        cur = conn.execute("INSERT INTO events (job_id, at, phase, reason, message) "
                           "VALUES (?,?,?,?,?)", (new, now, Phase.PENDING.value,
                                                  Reason.RETRIED.value, None))
        events.append(Event(cur.lastrowid or 0, new, project, name, now, Phase.PENDING.value,
                            Reason.RETRIED.value, None, None))
        ids.append(new)
        if cell == 0 and reason == Reason.CANARY_FAILED:
            canary = new
    smoke = conn.execute("SELECT json_extract(spec, '$.smoke_job') FROM sweeps WHERE id = ?",
                         (sweep_id,)).fetchone()[0]
    if reason == Reason.CANARY_FAILED and smoke is not None:
        canary, event = _copy_smoke(conn, smoke, sweep_name, now)
        events.append(event)
        conn.execute("UPDATE sweeps SET spec = json_set(spec, '$.smoke_job', ?) WHERE id = ?",
                     (canary, sweep_id))
    target = SweepPhase.CANARY if canary is not None else SweepPhase.RUNNING
    set_sweep_phase(conn, sweep_id, target, now, Reason.RETRIED,
                    f"{len(ids)} cells run again" + (", the canary first" if canary else ""))
    conn.execute("UPDATE sweeps SET ended_at = NULL WHERE id = ?", (sweep_id,))
    return RetriedCells(ids, canary), events


def _require_sources(conn: sqlite3.Connection, sweep_name: str, job_ids: list[int]) -> None:
    """A retry copies its cells' specs: the source they name must still be uploaded (the
    retention pass drops a source no unfinished job names, after keep_ended)."""
    for sha, uid in conn.execute(
            f"SELECT DISTINCT json_extract(spec, '$.source'), owner_uid FROM jobs WHERE id IN "
            f"({','.join('?' * len(job_ids))}) AND json_extract(spec, '$.source') IS NOT NULL",
            job_ids).fetchall():
        if not conn.execute("SELECT 1 FROM sources WHERE sha256 = ? AND owner_uid = ?",
                            (sha, uid)).fetchone():
            raise errors.Conflict(f"sweep {sweep_name!r}: its source {sha[:12]} was removed "
                                  "by retention (keep_ended); run the sweep anew")


def _copy_smoke(conn: sqlite3.Connection, old: int, sweep_name: str,
                now: float) -> tuple[int, Event]:
    """The failed smoke canary's job again, as `<sweep>-canary-r<try>`; its tries are
    counted by the sweep's id, so nobody else's job of a like name shifts them."""
    new = next_job_id(conn)
    project, sweep_id = conn.execute("SELECT project, canary_of FROM jobs WHERE id = ?",
                                     (old,)).fetchone()
    tries = conn.execute("SELECT COUNT(*) FROM jobs WHERE canary_of = ?",
                         (sweep_id,)).fetchone()[0]
    name = f"{sweep_name}-{SMOKE_SUFFIX}-r{tries + 1}"
    if conn.execute("SELECT 1 FROM jobs WHERE project = ? AND name = ?",
                    (project, name)).fetchone():
        raise errors.AlreadyExists(f"name: job {name!r} already exists in project "
                                   f"{project!r}; rename it to retry the canary")
    conn.execute(
        "INSERT INTO jobs (id, project, name, owner_uid, owner_gid, owner, phase, reason, "
        "spec, labels, created_at, canary_of) SELECT ?, project, ?, owner_uid, owner_gid, "
        "owner, ?, ?, spec, labels, ?, canary_of FROM jobs WHERE id = ?",
        (new, name, Phase.PENDING.value, Reason.RETRIED.value, now, old))
    for table, columns in (("job_secrets", "env, value"), ("job_volumes", "path, volume")):
        conn.execute(f"INSERT INTO {table} (job_id, {columns}) SELECT ?, {columns} "
                     f"FROM {table} WHERE job_id = ?", (new, old))
    return new, _event(conn, (new, project, name), now, Phase.PENDING.value,
                       Reason.RETRIED.value, None, None)


def cancel_cells(conn: sqlite3.Connection, job_ids: list[int], now: float, reason: str,
                 message: str) -> tuple[list[int], list[Event]]:
    """Cancel cells that wait (Pending, or Suspended); returns the ones cancelled."""
    cancelled, events = [], []
    for job_id in job_ids:
        row = conn.execute("SELECT phase FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None or row[0] not in (Phase.PENDING, Phase.SUSPENDED):
            continue
        events.append(_transition(conn, job_id, Phase.CANCELLED, now, reason, message,
                                  ended_at=now))
        cancelled.append(job_id)
    return cancelled, events


def remove_sweep(conn: sqlite3.Connection, sweep_id: int, now: float,
                 by: str) -> tuple[list[int], list[Event]]:
    """An ended sweep leaves listings and frees its name, as `job rm` does for a job: the
    sweep and every job it made (cells, retried tries, smoke canary) renamed `NAME~ID`,
    their attempts and cost kept. Returns the jobs removed (their directories go next)."""
    row = conn.execute("SELECT phase, name, removed_at FROM sweeps WHERE id = ?",
                       (sweep_id,)).fetchone()
    if row is None or row[2] is not None:
        raise errors.NotFound(f"sweep {sweep_id} does not exist")
    phase, name, _ = row
    if phase not in {p.value for p in SWEEP_TERMINAL}:
        raise errors.Conflict(f"sweep {name!r} is {phase}; cancel it first (`sweep cancel`), "
                              "or `map --replace`")
    made = conn.execute("SELECT id, phase, project, name FROM jobs "
                        "WHERE (sweep_id = ? OR canary_of = ?) AND removed_at IS NULL "
                        "ORDER BY id", (sweep_id, sweep_id)).fetchall()
    terminal = {p.value for p in TERMINAL}
    if live := [r[3] for r in made if r[1] not in terminal]:
        raise errors.Conflict(f"sweep {name!r}: {len(live)} of its jobs have not ended "
                              f"({live[0]} first); remove it once they have")
    conn.execute("UPDATE sweeps SET name = name || '~' || id, removed_at = ? WHERE id = ?",
                 (now, sweep_id))
    sweep_event(conn, sweep_id, now, SweepPhase(phase), Reason.REMOVED,
                f"removed by {by}; the name {name!r} is free")
    events = []
    for job_id, job_phase, project, job_name in made:
        conn.execute("UPDATE jobs SET name = name || '~' || id, removed_at = ? WHERE id = ?",
                     (now, job_id))
        conn.execute("DELETE FROM outputs WHERE job_id = ?", (job_id,))
        events.append(_event(conn, (job_id, project, f"{job_name}~{job_id}"), now, job_phase,
                             Reason.REMOVED, f"removed with sweep {name!r} by {by}", None))
    return [r[0] for r in made], events
