"""The retention pass's one transaction: which ended jobs are past their time (each marked
collected with its event, its output rows gone) and which uploads no unfinished job names
any more (forgotten). Run in the writer, from indexes, so a create that names a source
either commits before it (and is seen) or after (and finds the source gone). What the rows
left still name in the blob store is read after, on the reader: `blob_refs`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field

from noduslocal.daemon.accounts import user_name
from noduslocal.daemon.store import Store
from noduslocal.daemon.store.job_writes import _event
from noduslocal.daemon.store.rows import TERMINAL_SQL
from noduslocal.domain.jobs import Event
from noduslocal.domain.states import SWEEP_TERMINAL, Reason
from noduslocal.domain.units import fmt_duration

SWEEP_TERMINAL_SQL = ", ".join(f"'{p.value}'" for p in sorted(SWEEP_TERMINAL))


@dataclass(frozen=True)
class DueJob:
    id: int
    owner_uid: int
    owner: str
    project: str
    name: str


BATCH = 200  # ended jobs looked at per transaction: the writer is held ~20 ms, not seconds

Cursor = tuple[float, int]  # (ended_at, id) of the last ended job looked at


@dataclass
class Reclaimed:
    jobs: list[DueJob] = field(default_factory=list)
    sources: list[tuple[str, int, int]] = field(default_factory=list)  # sha, uid, size
    after: Cursor | None = None  # where the next batch starts; None: this was the last

    def add(self, batch: Reclaimed) -> None:
        self.jobs += batch.jobs
        self.sources += batch.sources
        self.after = batch.after


def reclaim_due(conn: sqlite3.Connection, now: float, keep_for: Callable[[str], float | None],
            shortest: float | None, active: frozenset[int], dry_run: bool,
            after: Cursor = (-1.0, 0),
            due_before: frozenset[int] = frozenset()) -> tuple[Reclaimed, list[Event]]:
    """One batch: the ended jobs after `after` (in order of their end) that are past their
    keep, and with the last batch the uploads nobody needs. `shortest`: the least keep of
    anyone (None: everyone keeps forever); `active`: jobs whose attempt or runner still
    uses their directory; `due_before`: what earlier batches found (a dry run left them
    uncollected, and they name no upload any more)."""
    found, events = Reclaimed(), []
    if shortest is None:
        return found, events
    rows = _ended_jobs(conn, now - shortest, after)
    if len(rows) == BATCH:
        found.after = (rows[-1][4], rows[-1][0].id)
    for job, ended, live_sweep, phase, _ in rows:
        keep = keep_for(job.owner)
        if keep is None or job.id in active or live_sweep or now - ended < keep:
            continue
        found.jobs.append(job)
        if dry_run:
            continue
        conn.execute("UPDATE jobs SET collected_at = ? WHERE id = ?", (now, job.id))
        conn.execute("DELETE FROM outputs WHERE job_id = ?", (job.id,))
        events.append(_event(
            conn, (job.id, job.project, job.name), now, phase, Reason.COLLECTED,
            f"retention removed its workspace, logs and outputs: ended "
            f"{fmt_duration(round(now - ended))} ago, past keep_ended ({fmt_duration(keep)})",
            None))
    if found.after is not None:
        return found, events
    due = due_before | {job.id for job in found.jobs}
    for sha, uid, size, at in conn.execute(
            "SELECT sha256, owner_uid, size, created_at FROM sources WHERE created_at <= ?",
            (now - shortest,)).fetchall():
        keep = keep_for(user_name(uid))
        if keep is None or now - at < keep or _named(conn, sha, uid, due):
            continue
        found.sources.append((sha, uid, size))
        if not dry_run:
            conn.execute("DELETE FROM sources WHERE sha256 = ? AND owner_uid = ?", (sha, uid))
    return found, events


def _ended_jobs(conn: sqlite3.Connection, before: float,
                after: Cursor) -> list[tuple[DueJob, float, bool, str, float]]:
    """Up to BATCH ended jobs not yet collected that ended before `before`, after `after`:
    the job, when its time started (its sweep's end for a cell), whether its sweep still
    runs (its cells wait for it), its phase and its own end."""
    rows = conn.execute(
        f"SELECT j.id, j.owner_uid, j.owner, j.project, j.name, "
        f"MAX(j.ended_at, COALESCE(s.ended_at, 0)), "
        f"s.id IS NOT NULL AND s.phase NOT IN ({SWEEP_TERMINAL_SQL}), j.phase, j.ended_at "
        f"FROM jobs j LEFT JOIN sweeps s ON s.id = COALESCE(j.sweep_id, j.canary_of) "
        f"WHERE j.collected_at IS NULL AND j.removed_at IS NULL AND j.ended_at IS NOT NULL "
        f"AND j.ended_at <= ? AND (j.ended_at, j.id) > (?, ?) "
        f"AND j.phase IN ({TERMINAL_SQL}) ORDER BY j.ended_at, j.id LIMIT {BATCH}",
        (before, *after)).fetchall()
    return [(DueJob(*row[:5]), row[5], bool(row[6]), row[7], row[8]) for row in rows]


def _named(conn: sqlite3.Connection, sha: str, uid: int, due: set[int]) -> bool:
    """Whether a job not (being) collected names the upload `sha` of `uid`."""
    rows = conn.execute(
        "SELECT id FROM jobs WHERE json_extract(spec, '$.source') = ? AND owner_uid = ? "
        "AND collected_at IS NULL AND removed_at IS NULL", (sha, uid)).fetchall()
    return any(job_id not in due for (job_id,) in rows)


def blob_refs(store: Store, dropped: Reclaimed) -> set[str]:
    """Every blob still named: output rows of uncollected jobs and uploads, read after the
    pass's commit (on a thread, apart from the API's reader). A dry run's rows are still
    there: those the pass would drop are left out."""
    due = {job.id for job in dropped.jobs}
    forgotten = {(sha, uid) for sha, uid, _ in dropped.sources}
    outputs, sources = store.read_apart(["SELECT job_id, sha256 FROM outputs WHERE sha256 != ''",
                                         "SELECT sha256, owner_uid FROM sources"])
    return ({sha for job_id, sha in outputs if job_id not in due}
            | {sha for sha, uid in sources if (sha, uid) not in forgotten})


async def gone_dirs(store: Store, on_disk: list[int]) -> list[int]:
    """Those of the jobs with a directory that were collected or removed: a crash between
    the commit and the removal left it."""
    gone = []
    for at in range(0, len(on_disk), 500):
        chunk = on_disk[at:at + 500]
        gone += [job_id for (job_id,) in await store.fetchall(
            f"SELECT id FROM jobs WHERE id IN ({','.join('?' * len(chunk))}) "
            "AND (collected_at IS NOT NULL OR removed_at IS NOT NULL)", tuple(chunk))]
    return gone
