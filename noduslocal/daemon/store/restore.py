"""Putting back a job whose rows the database lost (a damaged or cut WAL drops its newest
commits) from what its directory proves: the job, its attempts and their exits, and an
event saying it was recovered, in one transaction.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, replace

from noduslocal.daemon.store.job_writes import (
    Outcome,
    _event,
    finish_attempt,
    raise_job_id_floor,
    start_attempt,
)
from noduslocal.domain.jobs import Event, JobSpec
from noduslocal.domain.states import AttemptPhase, Phase

NAME_MAX = 63  # validation.NAME_RE's limit


@dataclass(frozen=True)
class LostAttempt:
    number: int
    phase: AttemptPhase  # Exited, Lost or NotStarted: a recovered attempt has ended
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    signal: int | None
    reason: str
    message: str | None
    armed: bool = False  # its shim was let go as its start was queued (before the commit)
    # Marked abandoned under its locks, nothing having started in it: no shim can start
    # there any more, so it ends NotStarted here rather than wait for an adoption.
    abandoned: bool = False


@dataclass(frozen=True)
class LostJob:
    """A job as its directory proves it: its record (written when its directory was
    made), and the verdict its attempts' exit records give."""

    id: int
    project: str
    name: str
    owner_uid: int
    owner_gid: int
    owner: str
    spec: JobSpec
    labels: dict[str, str]
    created_at: float
    attempts: tuple[LostAttempt, ...]
    phase: Phase
    reason: str
    message: str


def free_name(conn: sqlite3.Connection, project: str, name: str, job_id: int) -> str:
    """The job's own name when no job holds it now, else NAME-recovered-ID (cut to fit)."""
    taken = "SELECT 1 FROM jobs WHERE project = ? AND name = ?"
    if not conn.execute(taken, (project, name)).fetchone():
        return name
    again = 0
    while True:
        suffix = f"-recovered-{job_id}" + (f"-{again}" if again else "")
        candidate = name[:NAME_MAX - len(suffix)].rstrip("-") + suffix
        if not conn.execute(taken, (project, candidate)).fetchone():
            return candidate
        again += 1


def restore_job(conn: sqlite3.Connection, job: LostJob,
                now: float) -> tuple[str | None, list[Event]]:
    """Insert the lost job, its attempts and a Recovered event; returns the name it got
    (None, and nothing written, when the database knows that id after all)."""
    if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job.id,)).fetchone():
        return None, []
    name = free_name(conn, job.project, job.name, job.id)
    last = job.attempts[-1] if job.attempts else None
    started = [a.started_at for a in job.attempts if a.started_at is not None]
    ended_at = (last.ended_at if last is not None and last.ended_at is not None else now)
    retries_used = min(job.spec.retries, sum(
        1 for a in job.attempts[:-1] if a.phase == AttemptPhase.LOST))
    conn.execute(
        "INSERT INTO jobs (id, project, name, owner_uid, owner_gid, owner, phase, reason, "
        "message, spec, labels, created_at, started_at, ended_at, exit_code, signal, "
        "attempts, retries_used) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (job.id, job.project, name, job.owner_uid, job.owner_gid, job.owner,
         job.phase.value, job.reason, job.message, json.dumps(job.spec.to_wire()),
         json.dumps(job.labels), job.created_at, min(started) if started else None,
         ended_at, last.exit_code if last else None, last.signal if last else None,
         len(job.attempts), retries_used))
    conn.executemany(
        "INSERT INTO attempts (job_id, number, phase, created_at, started_at, ended_at, "
        "exit_code, signal, reason, message) VALUES (?,?,?,?,?,?,?,?,?,?)",
        [(job.id, a.number, a.phase.value, a.created_at, a.started_at, a.ended_at,
          a.exit_code, a.signal, a.reason, a.message) for a in job.attempts])
    # Its volumes, where they still exist (a volume's row may have been lost with it).
    conn.executemany(
        "INSERT INTO job_volumes (job_id, path, volume) "
        "SELECT ?, ?, name FROM volumes WHERE name = ?",
        [(job.id, path, volume) for path, volume in job.spec.volumes.items()])
    raise_job_id_floor(conn, job.id)
    event = _event(conn, (job.id, job.project, name), now, job.phase.value, job.reason,
                   job.message, last.number if last else None)
    return name, [event]


def catch_up(conn: sqlite3.Connection, job_id: int, known: int, current: LostAttempt | None,
             later: list[LostAttempt], message: str,
             now: float) -> tuple[int | None, list[Event]]:
    """The starts the database lost of a job it knows (`known`: the attempts it had), as
    the job's directory proves them: the attempt it thought current ended (`current`),
    each later one started and ended but the last, which is left Starting for the
    recovery to adopt or end like any attempt a restart finds (one abandoned ends here,
    its job pending again). Returns that attempt's
    number; None (nothing written) when the job's row moved on meanwhile."""
    row = conn.execute("SELECT attempts FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None or row[0] != known or not later:
        return None, []
    events: list[Event] = []
    ends = ([current] if current is not None else []) + later[:-1]
    for number, attempt in enumerate(later, start=known + 1):
        if number != attempt.number:
            raise ValueError(f"attempt {attempt.number} is not the next one ({number})")
    for attempt in ends:
        if attempt is not current:
            _, started = start_attempt(conn, job_id, attempt.started_at or now)
            events += started
        phase = attempt.phase
        if phase == AttemptPhase.NOT_STARTED and attempt is current and conn.execute(
                "SELECT phase FROM attempts WHERE job_id = ? AND number = ?",
                (job_id, attempt.number)).fetchone()[0] == AttemptPhase.RUNNING:
            phase = AttemptPhase.LOST
        spent = phase == AttemptPhase.LOST  # a lost box spends a retry; an exit, unknown
        _, ended = finish_attempt(conn, job_id, attempt.number, Outcome(
            phase, Phase.PENDING, attempt.reason, f"{message}: {attempt.message or 'ended'}",
            attempt.exit_code, attempt.signal, spend_retry=spent),
            attempt.ended_at or now)
        events += ended
    number, started = start_attempt(conn, job_id, later[-1].started_at or now)
    if later[-1].abandoned:
        _, ended = finish_attempt(conn, job_id, number, Outcome(
            AttemptPhase.NOT_STARTED, Phase.PENDING, later[-1].reason,
            later[-1].message), now)
        return number, [*events, *started, *ended]
    last = started[-1]
    text = f"{message}: attempt {number} had started"
    conn.execute("UPDATE events SET message = ? WHERE seq = ?", (text, last.seq))
    conn.execute("UPDATE jobs SET message = ? WHERE id = ?", (text, job_id))
    return number, [*events, *started[:-1], replace(last, message=text)]
