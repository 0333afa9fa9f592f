"""`GET /v1/sweeps` for a page of sweeps whose cells failed: its time, and what the daemon
read for it (rchar). `make` runs SWEEPS sweeps of CELLS failing cells each through a real
daemon in ROOT (each cell's stderr ends in one of three errors); `time` starts a daemon on
ROOT and asks for the page ROUNDS times. To compare daemons, `time` copies of one ROOT,
each with PYTHONPATH at its checkout; for one from before migration 0023, downgrade its
copy first (sqlite3 ROOT/data/noduslocal.db "ALTER TABLE attempts DROP COLUMN stderr_line;
PRAGMA user_version = 22"), and `UPDATE attempts SET stderr_line = NULL` times the ends
recorded before it (their files are read).

    python scripts/bench/sweep_listing.py make ROOT [SWEEPS] [CELLS]   (100 x 200)
    python scripts/bench/sweep_listing.py time ROOT [ROUNDS]           (9)
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from noduslocal import testing

SCRIPT = ('case $((NODUS_TASK_ID % 3)) in 0) echo "loading shard $NODUS_TASK_ID" >&2; '
          'echo "FileNotFoundError: /data/shard-$NODUS_TASK_ID.npz" >&2; exit 2;; '
          '1) echo "ValueError: batch $NODUS_TASK_ID too big" >&2; exit 1;; '
          '*) echo "RuntimeError: loss is nan at step $NODUS_TASK_ID" >&2; exit 1;; esac')


def make(root: Path, sweeps: int, cells: int) -> None:
    d = testing.Daemon(root, cpus=16, memory="64GiB", log_level="WARNING")
    d.start()
    try:
        client = d.client()
        start = time.monotonic()
        for n in range(sweeps):
            client.create_sweep({"name": f"failing-{n}", "canary": "none",
                                 "max_parallel": 16, "grid": {"X": list(range(cells))},
                                 "template": {"command": ["sh", "-c", SCRIPT],
                                              "cpu": 0.1}})
            status = client.wait_sweep(f"failing-{n}", timeout=3600)
            assert status["counts"] == {"Failed": cells}, status["counts"]
            print(f"sweep {n + 1}/{sweeps} ended ({time.monotonic() - start:.0f} s)",
                  flush=True)
    finally:
        d.stop()


def bytes_read(pid: int) -> int:
    """What process `pid` has read so far (rchar: files, the database and its sockets)."""
    io = Path(f"/proc/{pid}/io").read_text().split()
    return int(io[io.index("rchar:") + 1])


def time_listing(root: Path, rounds: int) -> None:
    d = testing.Daemon(root, cpus=16, memory="64GiB", log_level="WARNING")
    d.start()
    try:
        client = d.client()
        assert d.proc is not None
        times, read = [], []
        for _ in range(rounds):
            before = bytes_read(d.proc.pid)
            start = time.perf_counter()
            page = client.transport.request("GET", "/v1/sweeps", query={"all": "1"},
                                            timeout=600)
            times.append(time.perf_counter() - start)
            read.append(bytes_read(d.proc.pid) - before)
            assert len(page["sweeps"]) == min(100, len(client.list_sweeps(all=True)))
            assert all(s["failures"] for s in page["sweeps"])
        print(f"{len(page['sweeps'])} sweeps: first {times[0] * 1000:.0f} ms, median "
              f"{statistics.median(times) * 1000:.0f} ms, min {min(times) * 1000:.0f} ms "
              f"over {rounds}; the daemon read {statistics.median(read) / 2**20:.1f} MiB "
              "per listing (median)")
    finally:
        d.stop()


if __name__ == "__main__":
    what, root = sys.argv[1], Path(sys.argv[2])
    if what == "make":
        os.makedirs(root, exist_ok=True)
        make(root, int(sys.argv[3]) if len(sys.argv) > 3 else 100,
             int(sys.argv[4]) if len(sys.argv) > 4 else 200)
    else:
        time_listing(root, int(sys.argv[3]) if len(sys.argv) > 3 else 9)
