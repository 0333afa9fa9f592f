"""What merging a gang's logs costs the daemon: a real daemon runs a host gang whose ranks
each print BYTES (`yes | head -c BYTES`, two-byte lines: the prefixes' worst case), and the
table says the bytes the ranks wrote, the bytes of `merged.log`, and the daemon's resident
memory before the job and at its peak (the kernel's high-water mark, VmHWM).

    python scripts/bench/gang_logs.py [BYTES] [NODES]    default 100000000 bytes, 2 ranks
    target: peak RSS within 50 MB of the idle daemon's; merged = ranks' bytes + prefixes
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import table

from noduslocal import testing
from noduslocal.daemon.runtime.base import LOG_FILES, rank_dir

PREFIX = len(b"[r0] ")  # the prefix of every merged line (ranks 0-9)


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def newlines(path: Path) -> int:
    count = 0
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            count += block.count(b"\n")
    return count


def gang_attempt(d: testing.Daemon) -> Path:
    """The gang's attempt directory: the one directory with a rank 1 (the only gang)."""
    return next(d.data_dir.glob("jobs/*/attempt-1/rank-1")).parent


def main(size: int, nodes: int) -> None:
    with testing.daemon(cpus=nodes + 1, memory="8GiB") as d:
        assert d.proc is not None
        c = d.client()
        c.create_job({"name": "warm", "command": ["true"], "cpu": "100m"})
        c.wait_job("warm", timeout=60)
        idle = status_kib(d.proc.pid, "VmRSS")
        began = time.monotonic()
        c.create_job({"name": "loud", "cpu": "100m", "distributed": {"nodes": nodes},
                            "command": ["sh", "-c", f"yes | head -c {size}"]})
        done = c.wait_job("loud", timeout=3600)
        took = time.monotonic() - began
        peak = status_kib(d.proc.pid, "VmHWM")
        directory = gang_attempt(d)
        logs = [rank_dir(directory, r) / LOG_FILES["all"] for r in range(nodes)]
        ranks = sum(p.stat().st_size for p in logs)
        lines = sum(newlines(p) for p in logs)
        merged = (directory / "merged.log").stat().st_size
        rows = [{"ranks": str(nodes), "rank bytes in": f"{ranks:,}",
                 "merged bytes out": f"{merged:,}",
                 "expected (in + prefixes)": f"{ranks + PREFIX * lines:,}",
                 "idle RSS MB": f"{idle / 1024:.0f}", "peak RSS MB": f"{peak / 1024:.0f}",
                 "job s": f"{took:.1f}", "phase": done["phase"]}]
        print(table(rows))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000_000,
         int(sys.argv[2]) if len(sys.argv) > 2 else 2)
