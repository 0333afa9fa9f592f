"""The SQLite store: one writer connection (group commits, see writer.py) and one reader
connection, both through aiosqlite, over a WAL database with synchronous=FULL (NORMAL for
an attempt's start, Running and end on this box: writer.py says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiosqlite

from noduslocal.daemon.store import job_writes
from noduslocal.daemon.store import rows as records
from noduslocal.daemon.store import sweeps as sweep_ops
from noduslocal.daemon.store.integrity import check_intact
from noduslocal.daemon.store.migrate import migrate
from noduslocal.daemon.store.rows import CellAsks, CellGroup, FailedCell
from noduslocal.daemon.store.writer import OnCommit, Operation, Writer
from noduslocal.domain.jobs import AttemptRecord, Event, JobRecord
from noduslocal.domain.states import ATTEMPT_ENDED
from noduslocal.domain.sweeps import SweepRecord

__all__ = ["Store", "job_writes"]

_PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = FULL",
    "PRAGMA busy_timeout = 5000",
    "PRAGMA foreign_keys = ON",
    "PRAGMA mmap_size = 268435456",
)

CURRENT = "sweep_id = ? AND superseded_by IS NULL"  # each cell's latest job


def _marks(ids: list[int]) -> str:
    return ",".join("?" * len(ids))


# A cell group's count and times (CellGroup's count, wall, ran, started; one parameter: the
# time a cell not started yet counts as starting).
_CELL_TIMES = (
    "COUNT(*), COALESCE(SUM(CASE WHEN ended_at IS NOT NULL THEN ended_at - started_at END), "
    "0), COUNT(CASE WHEN ended_at IS NOT NULL THEN started_at END), COALESCE(SUM(CASE WHEN "
    "ended_at IS NULL THEN COALESCE(started_at, ?) END), 0)")


def _by_sweep(sweep_ids: list[int], rows: list[Any]) -> dict[int, list[Any]]:
    """Rows whose first column is a sweep id, by sweep, in their order; every sweep asked
    for has a list (an empty one where no row is its)."""
    by_sweep: dict[int, list[Any]] = {sweep_id: [] for sweep_id in sweep_ids}
    for row in rows:
        by_sweep[row[0]].append(row)
    return by_sweep


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer_conn: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._writer: Writer | None = None

    async def open(self, on_commit: OnCommit, batch_max: int = 256,
                   job_id_floor: int = 0) -> None:
        """`job_id_floor`: the highest job id found on disk; no new job gets one below."""
        await asyncio.to_thread(self._migrate, job_id_floor)
        # Used on the loop and on its thread in turn (writer.py), never waiting for a lock
        # there: the writer's thread sets its own wait where it may.
        self._writer_conn = await self._connect(check_same_thread=False)
        await self._writer_conn.execute("PRAGMA busy_timeout = 0")
        self._reader = await self._connect()
        await self._reader.execute("PRAGMA query_only = ON")
        self._writer = Writer(self._writer_conn, self.path, on_commit, batch_max)
        self._writer.start()

    def _migrate(self, job_id_floor: int) -> None:
        # SQLite gives the -wal and -shm files the database's mode: make it private first.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(f"{self.path}{suffix}", 0o600)
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            for pragma in _PRAGMAS:
                conn.execute(pragma)
            check_intact(conn, self.path)
            migrate(conn)
            # Only when a directory is above every job known (job rows are never deleted):
            # a daemon restarted on a full disk must start without writing.
            conn.execute("UPDATE job_id_floor SET floor = ? WHERE floor < ? AND "
                         "? > (SELECT COALESCE(MAX(id), 0) FROM jobs)",
                         (job_id_floor, job_id_floor, job_id_floor))
        finally:
            conn.close()

    def backup_to(self, target: Path) -> None:
        """A consistent copy of the database in `target` (0600), taken with SQLite's
        online backup on a connection of its own while the daemon runs."""
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        source = sqlite3.connect(self.path)
        copy = sqlite3.connect(target)
        try:
            source.backup(copy)
        finally:
            copy.close()
            source.close()

    async def _connect(self, check_same_thread: bool = True) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None,
                                       check_same_thread=check_same_thread)
        for pragma in _PRAGMAS:
            await conn.execute(pragma)
        return conn

    async def close(self) -> None:
        if self._writer is not None:
            await self._writer.close()
        for conn in (self._writer_conn, self._reader):
            if conn is not None:
                await conn.close()
        self._writer = self._writer_conn = self._reader = None

    def commits_stalled(self) -> float | None:
        """Since when (monotonic) commits wait for disk space; None while they go through."""
        return self._writer.stalled_since if self._writer is not None else None

    def describe(self) -> str:
        return self._writer.describe() if self._writer is not None else "writer: closed"

    def write(self, op: Operation, quick: bool = False,
              volatile: bool = False) -> asyncio.Future[Any]:
        """Queue an operation for the next group commit; the future resolves after COMMIT.
        `quick`: a few statements on rows by key (an attempt's start or end), which may
        run on the event loop (writer.py). `volatile`: a quick operation on an attempt
        of this machine, whose processes a power loss would end too: it may commit
        without an fsync (writer.py)."""
        assert self._writer is not None, "store is not open"
        return self._writer.submit(op, quick=quick, volatile=volatile)

    def write_lazily(self, op: Operation, volatile: bool = False) -> asyncio.Future[Any]:
        """Queue an operation to join the next commit, at most writer.LAZY_DELAY from now:
        for a record that recovery finds again if a crash loses it (an attempt's Running:
        its shim's records say it runs), so a short task's start, Running and end cost two
        commits, not three."""
        assert self._writer is not None, "store is not open"
        return self._writer.submit(op, lazy=True, quick=True, volatile=volatile)

    def withdraw(self, future: asyncio.Future[Any]) -> bool:
        """Take a queued operation back before it is committed (writer.py's withdraw)."""
        assert self._writer is not None, "store is not open"
        return self._writer.withdraw(future)

    # --- reads: one statement each on the reader connection -------------------------------

    def read_apart(self, queries: list[str]) -> list[list[Any]]:
        """Each query's rows, from one snapshot on a read-only connection of its own (call
        it on a thread): a long scan (`du`, the retention pass's references) holds up
        neither the writer nor the API's reads."""
        conn = sqlite3.connect(f"{Path(self.path).resolve().as_uri()}?mode=ro", uri=True,
                               isolation_level=None)
        try:
            conn.execute("BEGIN")
            return [conn.execute(sql).fetchall() for sql in queries]
        finally:
            conn.close()

    async def fetchall(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """One statement on the reader connection (store/reports.py's queries use it)."""
        assert self._reader is not None, "store is not open"
        return list(await self._reader.execute_fetchall(sql, params))

    async def job(self, project: str, name: str) -> JobRecord | None:
        rows = await self.fetchall(
            f"SELECT {records.JOB_COLUMNS} FROM jobs WHERE project = ? AND name = ?",
            (project, name))
        return records.job_from_row(rows[0]) if rows else None

    async def job_by_id(self, job_id: int) -> JobRecord | None:
        rows = await self.fetchall(f"SELECT {records.JOB_COLUMNS} FROM jobs WHERE id = ?",
                                    (job_id,))
        return records.job_from_row(rows[0]) if rows else None

    async def jobs(self, *, phases: list[str] | None = None, owner: str | None = None,
                   project: str | None = None, labels: dict[str, str] | None = None,
                   active_only: bool = False, limit: int = 1000, before: int | None = None,
                   sweep_id: int | None = None) -> list[JobRecord]:
        """The newest `limit` jobs that match (with `before`: of those with a smaller id,
        the next page back), in id order."""
        where, params = ["removed_at IS NULL"], []
        if before is not None:
            where.append("id < ?")
            params.append(before)
        if sweep_id is not None:
            where.append("(sweep_id = ? OR canary_of = ?)")
            params.extend([sweep_id, sweep_id])
        if phases:
            where.append(f"phase IN ({','.join('?' * len(phases))})")
            params.extend(phases)
        if active_only:
            where.append(f"phase NOT IN ({records.TERMINAL_SQL})")
        if owner is not None:
            where.append("owner = ?")
            params.append(owner)
        if project is not None:
            where.append("project = ?")
            params.append(project)
        for key, value in (labels or {}).items():
            where.append("json_extract(labels, ?) = ?")
            params.extend([f'$."{key}"', value])
        clause = f"WHERE {' AND '.join(where)}"
        rows = await self.fetchall(
            f"SELECT {records.JOB_COLUMNS} FROM jobs {clause} ORDER BY id DESC LIMIT ?",
            (*params, limit))
        return [records.job_from_row(row) for row in reversed(rows)]

    async def max_job_id(self) -> int:
        rows = await self.fetchall("SELECT COALESCE(MAX(id), 0) FROM jobs")
        return int(rows[0][0])

    async def active_jobs(self) -> list[JobRecord]:
        return await self.jobs(active_only=True, limit=-1)

    async def attempts(self, job_id: int) -> list[AttemptRecord]:
        rows = await self.fetchall(
            f"SELECT {records.ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ? ORDER BY number",
            (job_id,))
        return [records.attempt_from_row(row) for row in rows]

    async def attempt_ended(self, job_id: int, number: int) -> bool:
        """Whether that attempt's end is committed (exited, lost or never started)."""
        rows = await self.fetchall(
            "SELECT phase FROM attempts WHERE job_id = ? AND number = ?", (job_id, number))
        return bool(rows) and rows[0][0] in ATTEMPT_ENDED

    async def jobs_by_ids(self, ids: list[int]) -> list[JobRecord]:
        rows = await self.fetchall(
            f"SELECT {records.JOB_COLUMNS} FROM jobs WHERE id IN ({','.join('?' * len(ids))})",
            tuple(ids))
        return [records.job_from_row(row) for row in rows]

    async def phases(self, job_ids: list[int], sweep_ids: list[int]
                     ) -> tuple[dict[int, str], dict[int, str]]:
        """The phase of each of those jobs, and of each of those sweeps, by id."""
        jobs = await self.fetchall(
            f"SELECT id, phase FROM jobs WHERE id IN ({_marks(job_ids)})", tuple(job_ids))
        sweeps = await self.fetchall(
            f"SELECT id, phase FROM sweeps WHERE id IN ({_marks(sweep_ids)})",
            tuple(sweep_ids))
        return {r[0]: r[1] for r in jobs}, {r[0]: r[1] for r in sweeps}

    async def sweep(self, project: str, name: str) -> SweepRecord | None:
        rows = await self.fetchall(f"SELECT {sweep_ops.SWEEP_COLUMNS} FROM sweeps "
                                    "WHERE project = ? AND name = ?", (project, name))
        return sweep_ops.sweep_from_row(rows[0]) if rows else None

    async def sweeps(self, *, project: str | None = None, active_only: bool = False,
                     limit: int = 1000, before: int | None = None) -> list[SweepRecord]:
        where: list[str] = ["removed_at IS NULL"]
        params: list[Any] = []
        if before is not None:
            where.append("id < ?")
            params.append(before)
        if active_only:
            where.append(f"phase NOT IN ({records.TERMINAL_SQL})")
        if project is not None:
            where.append("project = ?")
            params.append(project)
        clause = f"WHERE {' AND '.join(where)}"
        rows = await self.fetchall(f"SELECT {sweep_ops.SWEEP_COLUMNS} FROM sweeps {clause} "
                                    "ORDER BY id DESC LIMIT ?", (*params, limit))
        return [sweep_ops.sweep_from_row(row) for row in reversed(rows)]

    async def sweep_made(self, sweep_id: int) -> list[JobRecord]:
        """Every job the sweep made, found by its id: its cells, the ones a retry
        superseded, and its smoke canary's tries (never by a label or a name)."""
        rows = await self.fetchall(
            f"SELECT {records.JOB_COLUMNS} FROM jobs WHERE sweep_id = ? UNION ALL "
            f"SELECT {records.JOB_COLUMNS} FROM jobs WHERE canary_of = ?", (sweep_id, sweep_id))
        return [records.job_from_row(row) for row in rows]

    async def sweep_cells(self, sweep_id: int) -> list[tuple[int, int, str]]:
        """(job id, cell, phase) of every cell, in cell order."""
        return [tuple(row) for row in await self.fetchall(
            f"SELECT id, cell, phase FROM jobs WHERE {CURRENT} ORDER BY cell", (sweep_id,))]

    async def sweep_cell_jobs(self, sweep_id: int, offset: int = 0,
                              limit: int = -1) -> list[JobRecord]:
        rows = await self.fetchall(
            f"SELECT {records.JOB_COLUMNS} FROM jobs WHERE {CURRENT} AND cell >= ? "
            "ORDER BY cell LIMIT ?", (sweep_id, offset, limit))
        return [records.job_from_row(row) for row in rows]

    async def sweep_costs(self, sweep_id: int) -> tuple[float, float]:
        """The cost of every ended attempt of the sweep, and a typical cell's: the mean over
        cells that ran and ended (0 before any has)."""
        rows = await self.fetchall(
            "SELECT SUM(cost), AVG(CASE WHEN phase IN ('Succeeded', 'Failed', 'Cancelled') "
            "AND attempts > 0 THEN cost END) FROM jobs WHERE sweep_id = ?", (sweep_id,))
        return float(rows[0][0] or 0.0), float(rows[0][1] or 0.0)

    async def sweep_phase_before_suspend(self, sweep_id: int) -> str | None:
        """The phase a suspended sweep had when it was suspended (Canary or Running)."""
        rows = await self.fetchall(
            "SELECT phase FROM sweep_events WHERE sweep_id = ? AND phase NOT IN "
            "('Suspended', 'Pending') ORDER BY seq DESC LIMIT 1", (sweep_id,))
        return str(rows[0][0]) if rows else None

    async def sweep_totals(self, sweep_id: int) -> tuple[dict[str, int], float]:
        """Cells per phase (as each cell's latest job stands), and the cost of every ended
        attempt of the sweep, retried ones too."""
        return (await self.sweeps_totals([sweep_id]))[sweep_id]

    # --- a page of sweeps' status documents: each part one statement for the whole page,
    # by sweep id (one sweep's document is a page of one) ---------------------------------

    async def sweeps_totals(self, sweep_ids: list[int]
                            ) -> dict[int, tuple[dict[str, int], float]]:
        """Per sweep: cells per phase (as each cell's latest job stands), and the cost of
        every ended attempt of the sweep, retried ones too."""
        rows = await self.fetchall(
            "SELECT sweep_id, phase, SUM(superseded_by IS NULL), SUM(cost) FROM jobs "
            f"WHERE sweep_id IN ({_marks(sweep_ids)}) GROUP BY sweep_id, phase "
            "ORDER BY sweep_id, phase", tuple(sweep_ids))
        by_sweep = _by_sweep(sweep_ids, rows)
        return {sweep_id: ({row[1]: row[2] for row in mine if row[2]},
                           sum(row[3] or 0.0 for row in mine))
                for sweep_id, mine in by_sweep.items()}

    async def sweeps_best(self, sweep_ids: list[int]) -> dict[int, JobRecord]:
        """Per sweep that has one: the succeeded cell that reported the highest throughput;
        ties: the lower cost, then the lower cell."""
        rows = await self.fetchall(
            f"SELECT {records.JOB_COLUMNS} FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY "
            "sweep_id ORDER BY json_extract(metrics, '$.throughput') DESC, cost, cell) AS place "
            f"FROM jobs WHERE sweep_id IN ({_marks(sweep_ids)}) AND superseded_by IS NULL "
            "AND phase = 'Succeeded' AND json_extract(metrics, '$.throughput') IS NOT NULL) "
            "WHERE place = 1", tuple(sweep_ids))
        return {job.sweep_id: job for job in map(records.job_from_row, rows)
                if job.sweep_id is not None}

    async def sweeps_failed(self, sweep_ids: list[int], limit: int
                            ) -> dict[int, list[FailedCell]]:
        """Per sweep: its failed cells in cell order, at most `limit`, each with the last
        stderr line kept at its last attempt's end."""
        rows = await self.fetchall(
            "SELECT sweep_id, id, cell, name, exit_code, reason, message, attempts, "
            "(SELECT stderr_line FROM attempts WHERE job_id = f.id AND number = f.attempts) "
            "FROM (SELECT sweep_id, id, cell, name, exit_code, reason, message, attempts, "
            "ROW_NUMBER() OVER (PARTITION BY sweep_id ORDER BY cell) AS place FROM jobs "
            f"WHERE sweep_id IN ({_marks(sweep_ids)}) AND superseded_by IS NULL "
            "AND phase = 'Failed') AS f WHERE place <= ? ORDER BY sweep_id, cell",
            (*sweep_ids, limit))
        return {sweep_id: [FailedCell(*row) for row in mine]
                for sweep_id, mine in _by_sweep(sweep_ids, rows).items()}

    async def failed_jobs(self, job_ids: list[int]) -> dict[int, JobRecord]:
        """Jobs by id, however many (one JSON array, not a variable each): the failed cells
        whose stderr line was not kept, whose clusters read their files."""
        rows = await self.fetchall(
            f"SELECT {records.JOB_COLUMNS} FROM jobs WHERE id IN "
            "(SELECT value FROM json_each(?))", (json.dumps(job_ids),))
        return {job.id: job for job in map(records.job_from_row, rows)}

    async def sweeps_running(self, sweep_ids: list[int]) -> dict[int, list[int]]:
        """Per sweep: the job ids of the cells that start or run now, in cell order."""
        rows = await self.fetchall(
            f"SELECT sweep_id, id FROM jobs WHERE sweep_id IN ({_marks(sweep_ids)}) AND "
            "superseded_by IS NULL AND phase IN ('Starting', 'Running') "
            "ORDER BY sweep_id, cell", tuple(sweep_ids))
        return {sweep_id: [row[1] for row in mine]
                for sweep_id, mine in _by_sweep(sweep_ids, rows).items()}

    async def sweeps_cell_groups(self, sweep_ids: list[int], now: float,
                                 alike: Mapping[int, CellAsks] | None = None
                                 ) -> dict[int, list[CellGroup]]:
        """Per sweep: each cell's latest job, grouped by phase and GPU request: what an
        estimate needs, without reading every cell (one not started yet counts as
        starting `now`). `alike`: for the sweeps whose every cell asks what their template
        asks (no grid over `gpu`), that; their cells' specs are not parsed (10 ms of the
        reader's time for a 1,000-cell sweep's status, asked for at every wait's poll)."""
        alike = alike or {}
        same = [sweep_id for sweep_id in sweep_ids if sweep_id in alike]
        each = [sweep_id for sweep_id in sweep_ids if sweep_id not in alike]
        found: dict[int, list[CellGroup]] = {}
        if same:
            rows = await self.fetchall(
                f"SELECT sweep_id, phase, {_CELL_TIMES} FROM jobs WHERE sweep_id IN "
                f"({_marks(same)}) AND superseded_by IS NULL GROUP BY 1, 2 ORDER BY 1, 2",
                (now, *same))
            for sweep_id, mine in _by_sweep(same, rows).items():
                gpus, model, expected, cpu, memory = alike[sweep_id]
                found[sweep_id] = [CellGroup(row[1], gpus, model, expected, *row[2:],
                                             cpu=cpu, memory=memory) for row in mine]
        if each:
            rows = await self.fetchall(
                "SELECT sweep_id, phase, COALESCE(json_extract(spec, '$.gpu.count'), 0), "
                "json_extract(spec, '$.gpu.type'), json_extract(spec, '$.expected_duration'), "
                f"{_CELL_TIMES}, COALESCE(json_extract(spec, '$.cpu'), 1), "
                "COALESCE(json_extract(spec, '$.memory'), 0) "
                f"FROM jobs WHERE sweep_id IN ({_marks(each)}) AND superseded_by IS NULL "
                "GROUP BY 1, 2, 3, 4, 5, 10, 11 ORDER BY 1, 2, 3, 4, 5", (now, *each))
            found.update((sweep_id, [CellGroup(*row[1:]) for row in mine])
                         for sweep_id, mine in _by_sweep(each, rows).items())
        return {sweep_id: found[sweep_id] for sweep_id in sweep_ids}

    async def sweeps_first_cells(self, sweep_ids: list[int]) -> dict[int, str]:
        """Per sweep: the name of its lowest cell's latest job."""
        rows = await self.fetchall(
            "SELECT sweep_id, name, MIN(cell) FROM jobs "
            f"WHERE sweep_id IN ({_marks(sweep_ids)}) AND superseded_by IS NULL "
            "GROUP BY sweep_id", tuple(sweep_ids))
        return {row[0]: row[1] for row in rows}

    async def job_names(self, job_ids: list[int]) -> dict[int, str]:
        rows = await self.fetchall(
            f"SELECT id, name FROM jobs WHERE id IN ({_marks(job_ids)})", tuple(job_ids))
        return {row[0]: row[1] for row in rows}

    async def events(self, *, since: int = 0, job_id: int | None = None,
                     project: str | None = None, limit: int = 10000) -> list[Event]:
        where, params = ["e.seq > ?"], [since]
        if job_id is not None:
            where.append("e.job_id = ?")
            params.append(job_id)
        if project is not None:
            where.append("j.project = ?")
            params.append(project)
        rows = await self.fetchall(
            "SELECT e.seq, e.job_id, j.project, j.name, e.at, e.phase, e.reason, e.message, "
            f"e.attempt FROM events e JOIN jobs j ON j.id = e.job_id WHERE {' AND '.join(where)} "
            "ORDER BY e.seq LIMIT ?",
            (*params, limit))
        return [Event(*row) for row in rows]

    async def secrets(self, owner_uid: int) -> list[tuple[str, float, float]]:
        """(name, created_at, updated_at) of a user's secrets; never their values."""
        rows = await self.fetchall(
            "SELECT name, created_at, updated_at FROM secrets WHERE owner_uid = ? "
            "ORDER BY name", (owner_uid,))
        return [tuple(row) for row in rows]  # type: ignore[misc]

    async def gpu_usage(self, since: float) -> list[tuple[int, int, float, float]]:
        """(owner uid, GPUs, started, ended) of attempts with GPUs that ended since."""
        rows = await self.fetchall(
            "SELECT j.owner_uid, a.gpus, a.started_at, a.ended_at FROM attempts a "
            "JOIN jobs j ON j.id = a.job_id WHERE a.gpus IS NOT NULL "
            "AND a.started_at IS NOT NULL AND a.ended_at >= ? ORDER BY a.ended_at", (since,))
        return [(uid, len(json.loads(gpus)), started, ended)
                for uid, gpus, started, ended in rows]

    async def past_runs(self, owner_uid: int, limit: int = 500) -> list[tuple[str, float, float]]:
        """(spec JSON, run seconds, cost) of the user's latest succeeded jobs."""
        rows = await self.fetchall(
            "SELECT spec, ended_at - started_at, cost FROM jobs WHERE owner_uid = ? AND "
            "phase = 'Succeeded' AND started_at IS NOT NULL ORDER BY id DESC LIMIT ?",
            (owner_uid, limit))
        return [(spec, float(run), float(cost or 0)) for spec, run, cost in rows]

    async def drained_gpus(self) -> set[str]:
        return {row[0] for row in await self.fetchall("SELECT uuid FROM gpu_drains", ())}

    async def job_secret_values(self, job_id: int) -> dict[str, str]:
        rows = await self.fetchall("SELECT env, value FROM job_secrets WHERE job_id = ?",
                                    (job_id,))
        return {env: value for env, value in rows}

    async def outputs(self, job_id: int, index: int = -1) -> dict[str, dict[str, Any]]:
        """The job's collected outputs by name (an indexed job's: that index's)."""
        rows = await self.fetchall(
            "SELECT name, attempt, path, kind, size, sha256, collected_at, skipped, mode "
            "FROM outputs WHERE job_id = ? AND idx = ?", (job_id, index))
        return {row[0]: {"name": row[0], "attempt": row[1], "path": row[2], "kind": row[3],
                         "size": row[4], "sha256": row[5], "collected_at": row[6],
                         "skipped": row[7], "mode": row[8]}
                for row in rows}

    async def volumes(self, name: str | None = None) -> list[dict[str, Any]]:
        rows = await self.fetchall(
            "SELECT name, owner_uid, owner, created_at FROM volumes "
            + ("WHERE name = ? " if name is not None else "") + "ORDER BY name",
            (name,) if name is not None else ())
        return [{"name": r[0], "owner_uid": r[1], "owner": r[2], "created_at": r[3]}
                for r in rows]
