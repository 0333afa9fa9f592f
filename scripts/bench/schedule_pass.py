"""One scheduling pass with N pending jobs on 8 GPUs (issue: < 10 ms at 10,000, cost no
worse than n log n): the pure Queue with a GPU pool, fair share over 50 users, per-user
limits, and a blocked 8-GPU head so every pass walks the whole queue looking for backfill.

    .venv/bin/python scripts/bench/schedule_pass.py [N ...]
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import pct, table

from noduslocal.daemon.gpus import simulated
from noduslocal.daemon.scheduler.fairshare import Ledger
from noduslocal.daemon.scheduler.gpus import GpuPool
from noduslocal.daemon.scheduler.queue import Capacity, Limits, Queue, Request
from noduslocal.domain.gpu_request import GpuRequest

GiB = 2**30


def build(n: int, rnd: random.Random) -> Queue:
    ledger = Ledger(7 * 86400)
    now = time.time()
    for uid in range(50):
        ledger.charge(uid, rnd.random() * 100, now - rnd.random() * 86400)
    queue = Queue(Capacity(64_000, 512 * GiB, gpus=GpuPool(simulated.parse("8xH100"))),
                  limits=Limits(max_gpus=8, max_jobs=64),
                  usage=lambda uid: ledger.value(uid, time.time()))
    # Seven one-GPU jobs run with known ends; an 8-GPU head waits for them.
    for i in range(7):
        running = Request(i + 1, 1000, GiB, gpu=GpuRequest(1), owner_uid=i, expected=3600)
        queue.capacity.take(running, started_at=now)
    queue.push(Request(100, 1000, GiB, gpu=GpuRequest(8), owner_uid=99))
    for job_id in range(101, 101 + n):
        queue.push(Request(job_id, rnd.choice((500, 1000, 2000)), GiB,
                           gpu=GpuRequest(rnd.choice((1, 1, 2, 4))) if rnd.random() < .8
                           else None, owner_uid=rnd.randrange(50),
                           priority=rnd.choice((0, 0, 0, 1)),
                           expected=rnd.choice((None, 600.0, 7200.0))))
    return queue


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1000, 10_000, 40_000]
    rows = []
    base: tuple[int, float] | None = None
    for n in sizes:
        queue = build(n, random.Random(n))
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            started = queue.schedule()
            times.append(time.perf_counter() - t0)
            for req in started:  # keep the queue as it was for the next pass
                queue.capacity.give(req)
                queue.push(req)
        p50 = pct(times, 50)
        growth = ""
        if base is not None:
            ratio = (p50 / base[1]) / ((n / base[0]) * (max(1, n).bit_length()
                                                      / max(1, base[0]).bit_length()))
            growth = f"{ratio:.2f}"
        base = base or (n, p50)
        rows.append({"pending": str(n), "p50 ms": f"{p50 * 1000:.2f}",
                     "max ms": f"{max(times) * 1000:.2f}",
                     "started per pass": str(len(started)),
                     "cost / (n log n) vs first": growth})
    print(table(rows))
    print("target: < 10 ms at 10,000 pending; growth ratio <= ~1 means no worse than n log n")


if __name__ == "__main__":
    main()
