"""`noduslocal job run --detach -- true` as a whole process (interpreter start, imports,
one create), median over N runs against a daemon whose jobs stay queued.

    python scripts/bench/cli_latency.py [N]           target: median <= 250 ms
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import summary_ms, table

from noduslocal import testing


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    exe = shutil.which("noduslocal", path=str(Path(sys.executable).parent)) or shutil.which(
        "noduslocal")
    if exe is None:
        sys.exit("noduslocal is not installed; run scripts/test.sh or pip install -e .")
    d = testing.Daemon(cpus=1, log_level="WARNING")
    try:
        d.start()
        d.client().create_job({"name": "blocker", "command": ["sleep", "600"]}, retry=False)
        env = {**os.environ, "NODUSLOCAL_SOCKET": str(d.socket)}
        times = []
        for _ in range(n + 3):
            start = time.perf_counter()
            subprocess.run([exe, "job", "run", "--detach", "--", "true"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
        times = times[3:]  # the first runs fill the page cache
        print(table([{"what": "noduslocal job run --detach -- true", **summary_ms(times),
                      "median ms": f"{statistics.median(times) * 1000:.1f}"}]))
    finally:
        d.close()


if __name__ == "__main__":
    main()
