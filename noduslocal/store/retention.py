"""The retention pass's one transaction: which ended jobs are past their time (each marked
collected with its event, its output rows gone), which uploads no unfinished job names any
more, and every blob the rows left still name. Run in the writer, so a create that names a
source either commits before it (and is seen) or after (and finds the source gone).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field

from noduslocal.layout import user_name
from noduslocal.models import Event
from noduslocal.states import SWEEP_TERMINAL, Reason
from noduslocal.store.jobs import _event
from noduslocal.store.rows import TERMINAL_SQL
from noduslocal.units import fmt_duration

SWEEP_TERMINAL_SQL = ", ".join(f"'{p.value}'" for p in sorted(SWEEP_TERMINAL))


@dataclass(frozen=True)
class DueJob:
    id: int
    owner_uid: int
    owner: str
    project: str
    name: str


@dataclass
class Collection:
    jobs: list[DueJob] = field(default_factory=list)
    sources: list[tuple[str, int, int]] = field(default_factory=list)  # sha, uid, size
    referenced: set[str] = field(default_factory=set)  # blobs still named by some row
    gone: list[int] = field(default_factory=list)  # collected or removed jobs, by id


def collect(conn: sqlite3.Connection, now: float, keep_for: Callable[[str], float | None],
            active: frozenset[int], on_disk: frozenset[int],
            dry_run: bool) -> tuple[Collection, list[Event]]:
    """`active`: jobs with an attempt on the board (never collected); `on_disk`: jobs with
    a directory, to find those of collected or removed jobs a crash left behind."""
    found, events = Collection(), []
    names = dict(conn.execute("SELECT owner_uid, owner FROM jobs GROUP BY owner_uid"))
    for job, ended, live_sweep in _ended_jobs(conn):
        keep = keep_for(job.owner)
        if keep is None or job.id in active or live_sweep or now - ended < keep:
            continue
        found.jobs.append(job)
        if dry_run:
            continue
        conn.execute("UPDATE jobs SET collected_at = ? WHERE id = ?", (now, job.id))
        conn.execute("DELETE FROM outputs WHERE job_id = ?", (job.id,))
        phase = conn.execute("SELECT phase FROM jobs WHERE id = ?", (job.id,)).fetchone()[0]
        events.append(_event(
            conn, (job.id, job.project, job.name), now, phase, Reason.COLLECTED,
            f"retention removed its workspace, logs and outputs: ended "
            f"{fmt_duration(round(now - ended))} ago, past keep_ended ({fmt_duration(keep)})",
            None))
    due = {job.id for job in found.jobs}
    needed = {(sha, uid) for job_id, sha, uid in conn.execute(
        "SELECT id, json_extract(spec, '$.source'), owner_uid FROM jobs "
        "WHERE collected_at IS NULL AND removed_at IS NULL "
        "AND json_extract(spec, '$.source') IS NOT NULL") if job_id not in due}
    for sha, uid, size, at in conn.execute(
            "SELECT sha256, owner_uid, size, created_at FROM sources").fetchall():
        keep = keep_for(names.get(uid) or user_name(uid))
        if (sha, uid) in needed or keep is None or now - at < keep:
            found.referenced.add(sha)
            continue
        found.sources.append((sha, uid, size))
        if not dry_run:
            conn.execute("DELETE FROM sources WHERE sha256 = ? AND owner_uid = ?", (sha, uid))
    found.referenced |= {sha for job_id, sha in conn.execute(
        "SELECT job_id, sha256 FROM outputs WHERE sha256 != ''") if job_id not in due}
    found.referenced |= {sha for sha, _ in needed}
    if on_disk:
        found.gone = sorted(job_id for (job_id,) in conn.execute(
            f"SELECT id FROM jobs WHERE id IN ({','.join(map(str, sorted(on_disk)))}) "
            "AND (collected_at IS NOT NULL OR removed_at IS NOT NULL)"))
    return found, events


def _ended_jobs(conn: sqlite3.Connection) -> list[tuple[DueJob, float, bool]]:
    """Every ended job not yet collected: the job, when its time started (its sweep's end
    for a cell), and whether its sweep still runs (its cells wait for it)."""
    rows = conn.execute(
        f"SELECT j.id, j.owner_uid, j.owner, j.project, j.name, "
        f"MAX(j.ended_at, COALESCE(s.ended_at, 0)), "
        f"s.id IS NOT NULL AND s.phase NOT IN ({SWEEP_TERMINAL_SQL}) "
        f"FROM jobs j LEFT JOIN sweeps s ON s.id = j.sweep_id "
        f"WHERE j.collected_at IS NULL AND j.removed_at IS NULL AND j.ended_at IS NOT NULL "
        f"AND j.phase IN ({TERMINAL_SQL})").fetchall()
    return [(DueJob(*row[:5]), row[5], bool(row[6])) for row in rows]
