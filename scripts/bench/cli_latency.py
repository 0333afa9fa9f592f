"""The CLI and the SDK import as whole processes, median over N runs each, interleaved,
against a daemon whose jobs stay queued, beside the floor (`python -c pass` from the same
interpreter): `job run --detach -- true`, `job list`, `import noduslocal`.

    python scripts/bench/cli_latency.py [N]    targets: submit and list <= 40 ms median,
                                               import noduslocal <= 30 ms
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
        commands = {
            "python -c pass (the floor)": [sys.executable, "-c", "pass"],
            "python -c 'import noduslocal'": [sys.executable, "-c", "import noduslocal"],
            "noduslocal job run --detach -- true": [exe, "job", "run", "--detach", "--",
                                                    "true"],
            "noduslocal job list": [exe, "job", "list"],
        }
        times: dict[str, list[float]] = {what: [] for what in commands}
        for _ in range(n + 3):
            for what, argv in commands.items():
                start = time.perf_counter()
                subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
                times[what].append(time.perf_counter() - start)
        rows = []
        for what, took in times.items():
            took = took[3:]  # the first runs fill the page cache
            rows.append({"what": what, **summary_ms(took),
                         "median ms": f"{statistics.median(took) * 1000:.1f}"})
        print(table(rows))
    finally:
        d.close()


if __name__ == "__main__":
    main()
