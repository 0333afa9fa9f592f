"""1,000 jobs of `true` from one Python process through the SDK on a daemon with cpus=2,
from the first submit to the last completion, next to task-spooler (`tsp -S 2`, submitted
from a shell loop) in the same run.

    python scripts/bench/throughput.py [N]            target: no slower than tsp
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import table

import noduslocal as nodus
from noduslocal import testing


def run_noduslocal(n: int) -> tuple[float, float]:
    with testing.daemon(cpus=2, log_level="WARNING") as d:
        client = d.client()
        start = time.perf_counter()
        jobs = [nodus.Job.create(command=["true"]) for _ in range(n)]
        submitted = time.perf_counter() - start
        for job in jobs:
            job.wait()
        total = time.perf_counter() - start
        done = client.list_jobs(phases=["Succeeded"], limit=n + 10)
        assert len(done) == n, f"{len(done)} of {n} succeeded"
    return submitted, total


def run_tsp(n: int, numbered: bool = False) -> tuple[float, float] | None:
    """`tsp true` N times (`numbered`: `tsp true I` for I in 1..N, the command line `map
    ... -- true ::: ...` and GNU parallel run: coreutils' `true` given one argument looks
    for --help and loads the locale first, about 0.2 ms a task more on this box)."""
    if shutil.which("tsp") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TS_SOCKET": f"{tmp}/tsp.sock", "TS_MAXFINISHED": str(n + 10),
               "TMPDIR": tmp, "TS_SAVELIST": ""}
        subprocess.run(["tsp", "-S", "2"], env=env, check=True)
        arg = " $i" if numbered else ""
        script = (f"start=$(date +%s.%N); for i in $(seq {n}); do tsp true{arg} >/dev/null; "
                  "done; "
                  "sub=$(date +%s.%N); tsp -w >/dev/null 2>&1 || true; "
                  "while tsp | grep -qE ' (running|queued) '; do sleep 0.01; done; "
                  "end=$(date +%s.%N); echo $start $sub $end")
        out = subprocess.run(["bash", "-c", script], env=env, check=True, capture_output=True,
                             text=True).stdout.split()
        finished = subprocess.run(["tsp"], env=env, capture_output=True, text=True).stdout
        subprocess.run(["tsp", "-K"], env=env, capture_output=True)
        assert finished.count(" finished ") == n, "tsp did not finish every job"
        start, sub, end = (float(x) for x in out)
        return sub - start, end - start


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    rows = []
    ours = run_noduslocal(n)
    rows.append({"runner": "noduslocal (SDK, cpus=2)", "jobs": str(n),
                 "submit s": f"{ours[0]:.2f}", "total s": f"{ours[1]:.2f}",
                 "jobs/s": f"{n / ours[1]:.0f}"})
    theirs = run_tsp(n)
    if theirs is None:
        rows.append({"runner": "tsp -S 2: not installed (apt-get install task-spooler)"})
    else:
        rows.append({"runner": "task-spooler (tsp -S 2)", "jobs": str(n),
                     "submit s": f"{theirs[0]:.2f}", "total s": f"{theirs[1]:.2f}",
                     "jobs/s": f"{n / theirs[1]:.0f}"})
    print(table(rows))


if __name__ == "__main__":
    main()
