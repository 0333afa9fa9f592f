"""How long the retention pass holds the writer (its one transaction, which every job state
change waits behind) on a database with N retained ended jobs, an output row each and a
source on one in ten: the hourly pass that finds nothing due, one that collects 1%; and
its reads after the commit and a `du` measurement's, which run on a read-only connection
of their own on a thread (they hold up neither the writer nor the API's reader). SQLite
on disk, the daemon's pragmas.

    python scripts/bench/retention.py [N]     target: each transaction under 50 ms, N=100000
"""

from __future__ import annotations

import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import summary_ms, table

from noduslocal.daemon.store import reclaim
from noduslocal.daemon.store.migrate import migrate

DAY = 86400.0


def build(path: Path, n: int, now: float) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in ("PRAGMA journal_mode = WAL", "PRAGMA synchronous = FULL"):
        conn.execute(pragma)
    migrate(conn)
    conn.execute("BEGIN")
    for i in range(1, n + 1):
        sha = f"{i:064x}"
        spec = {"command": ["true"], "source": sha if i % 10 == 0 else None}
        # 1% ended 20 days ago (past 14d), the rest a day ago.
        ended = now - (20 * DAY if i % 100 == 0 else DAY)
        conn.execute("INSERT INTO jobs (id, project, name, owner_uid, owner_gid, owner, phase, "
                     "spec, labels, created_at, ended_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                     (i, "p", f"j{i}", 1000 + i % 8, 1000, f"user{i % 8}", "Succeeded",
                      json.dumps(spec), "{}", ended - 60, ended))
        conn.execute("INSERT INTO outputs (job_id, name, idx, attempt, path, kind, size, "
                     "sha256, collected_at) VALUES (?,?,?,?,?,?,?,?,?)",
                     (i, "out", -1, 1, "out", "file", 1000, f"{i + n:064x}", ended))
        if i % 10 == 0:
            conn.execute("INSERT INTO sources (sha256, owner_uid, size, created_at) "
                         "VALUES (?,?,?,?)", (sha, 1000 + i % 8, 5000, ended - 60))
    conn.execute("COMMIT")
    return conn


def timed(conn: sqlite3.Connection, now: float, dry_run: bool) -> tuple[float, float]:
    """(the longest transaction, the whole pass), in seconds."""
    longest, start, after = 0.0, time.perf_counter(), (-1.0, 0)
    while True:
        began = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        found, _ = reclaim.reclaim_due(conn, now, lambda user: 14 * DAY, 14 * DAY, frozenset(),
                                     dry_run, after)
        conn.execute("ROLLBACK" if dry_run else "COMMIT")
        longest = max(longest, time.perf_counter() - began)
        if found.after is None:
            return longest, time.perf_counter() - start
        after = found.after


def blob_refs(conn: sqlite3.Connection) -> float:
    """The pass's read of every blob still named (on the reader, after its commit)."""
    start = time.perf_counter()
    outputs = conn.execute("SELECT job_id, sha256 FROM outputs WHERE sha256 != ''").fetchall()
    sources = conn.execute("SELECT sha256, owner_uid FROM sources").fetchall()
    {sha for _, sha in outputs} | {sha for sha, _ in sources}
    return time.perf_counter() - start


def du_reads(conn: sqlite3.Connection) -> float:
    start = time.perf_counter()
    conn.execute("SELECT id, owner_uid, owner, phase FROM jobs "
                 "WHERE collected_at IS NULL AND removed_at IS NULL").fetchall()
    conn.execute("SELECT name, owner_uid, owner FROM volumes").fetchall()
    conn.execute("SELECT owner_uid, SUM(size) FROM (SELECT j.owner_uid, o.sha256, o.size FROM "
                 "outputs o JOIN jobs j ON j.id = o.job_id WHERE o.sha256 != '' UNION "
                 "SELECT owner_uid, sha256, size FROM sources) GROUP BY owner_uid").fetchall()
    return time.perf_counter() - start


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        conn = build(Path(tmp) / "bench.db", n, now)
        nothing_due = [timed(conn, now - 20 * DAY, dry_run=True) for _ in range(5)]
        dry = [timed(conn, now, dry_run=True) for _ in range(5)]
        collecting = [timed(conn, now, dry_run=False)]
        after = [timed(conn, now, dry_run=False) for _ in range(5)]

        def longest(runs: list[tuple[float, float]]) -> list[float]:
            return [run[0] for run in runs]

        def whole(runs: list[tuple[float, float]]) -> dict[str, str]:
            return {"whole pass ms": f"{max(run[1] for run in runs) * 1000:.1f}"}
        refs = [blob_refs(conn) for _ in range(5)]
        reads = [du_reads(conn) for _ in range(5)]
    print(table([
        {"what": f"writer held: pass, {n} retained jobs, none due",
         **summary_ms(longest(nothing_due)), **whole(nothing_due)},
        {"what": f"writer held: dry run, {n // 100} due", **summary_ms(longest(dry)),
         **whole(dry)},
        {"what": f"writer held: collecting {n // 100} jobs", **summary_ms(longest(collecting)),
         **whole(collecting)},
        {"what": "writer held: the next pass (nothing due)", **summary_ms(longest(after)),
         **whole(after)},
        {"what": "own connection: the blobs still named", **summary_ms(refs)},
        {"what": "own connection: du's reads", **summary_ms(reads)},
    ]))


if __name__ == "__main__":
    main()
