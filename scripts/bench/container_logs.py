"""Copying a container's log: the daemon's pump (noduslocal/daemon/runtime/docker/logs.py)
reading an ended container's whole log from dockerd into its capped files, as it does when
a container ends or a restarted daemon adopts one. A line a frame is the worst case: dockerd
sends each write of the job as a frame and an HTTP chunk of its own.

    python scripts/bench/container_logs.py [LINES] [ROUNDS]     default 300000 lines, 3
    PYTHONPATH=TREE python ...                                  another tree's pump

Per round: the wall time from the pump's start to its end and the CPU it took (this
process's, where the pump is the only busy thread), with a 256 KiB cap as the disk-full
test sets. Needs a running dockerd and the test image (scripts/build-test-images.sh).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import table

from noduslocal.daemon.runtime.docker import logs

IMAGE = "noduslocal-test/busybox:1"


def copy_once(container_id: str, directory: Path) -> None:
    if hasattr(logs, "LogPump"):
        async def run() -> None:
            pump = logs.LogPump(docker.from_env, container_id, directory, [], 256 * 1024)
            pump.start()
            assert await pump.drained(60)
        asyncio.run(run())
    else:  # a tree from before the pump was a class (d81cce5)
        logs.pump_logs(docker.from_env, container_id, directory, [], threading.Event(),
                       256 * 1024)


def main() -> None:
    lines = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    client = docker.from_env()
    container = client.containers.run(
        IMAGE, ["sh", "-c", f"seq 1 {lines}; echo done"], detach=True)
    try:
        container.wait()
        rows = []
        for r in range(rounds):
            with tempfile.TemporaryDirectory() as scratch:
                wall, cpu = time.perf_counter(), time.process_time()
                copy_once(container.id, Path(scratch))
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                tail = (Path(scratch) / "output.log").read_bytes()[-40:]
                assert tail.endswith(f"{lines}\ndone\n".encode()), tail
            rows.append({"round": str(r + 1), "lines": str(lines), "wall s": f"{wall:.2f}",
                         "CPU s": f"{cpu:.2f}", "CPU us a line": f"{cpu / lines * 1e6:.2f}"})
        print(f"pump: {logs.__file__}")
        print(table(rows))
    finally:
        container.remove(force=True)


if __name__ == "__main__":
    main()
