"""GPU idle gap, host-process runtime: from one job's exit to the next queued job's start
on the same GPU, p50 over N jobs (issue 4 target: < 50 ms). One simulated GPU, N jobs
queued at once; each prints the time it started and, last, the time it ends.

    .venv/bin/python scripts/bench/gpu_idle_gap.py [N]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import itertools

from common import summary_ms, table

import noduslocal as nodus
from noduslocal import testing

SCRIPT = "date +%s.%N; echo $CUDA_VISIBLE_DEVICES; sleep 0.02; date +%s.%N"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    with testing.daemon(cpus=2, memory="8GiB", log_level="WARNING",
                        config='simulate_gpus = "1xH100"\n'):
        jobs = [nodus.Job.create(command=["sh", "-c", SCRIPT], gpu=1) for _ in range(n)]
        for job in jobs:
            job.wait(timeout=600)
        spans = []
        for job in jobs:
            lines = list(job.iter_logs())
            spans.append((float(lines[0]), float(lines[-1]), lines[1]))
    spans.sort()
    assert len({gpu for _, _, gpu in spans}) == 1
    gaps = [nxt[0] - cur[1] for cur, nxt in itertools.pairwise(spans)]
    overlaps = sum(1 for g in gaps if g < 0)
    print(table([{"jobs": str(n), **summary_ms(gaps), "overlaps": str(overlaps)}]))
    print("gap = next job's first line - this job's last line (the job's own shell "
          "start and exit are inside it); target p50 < 50 ms")


if __name__ == "__main__":
    main()
