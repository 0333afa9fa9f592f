"""One scheduling pass with N pending jobs (issue 24: 40,000 under 25 ms, cost no worse
than n log n): the pure Queue with a GPU pool, fair share over 50 users, per-user limits.

- backfill: a blocked 8-GPU head on 8 x H100, jobs of every shape behind it; the pass
  starts what it can, then finds that nothing more fits and settles the rest per owner.
- walk: the worst case for that: an 8 x H100 head waits on jobs with no expected end
  while two L4s idle, and every job behind it asks for H100s; each might fit by the
  counts, so the pass checks every one (none may start: they would take the head's GPUs).

    .venv/bin/python scripts/bench/schedule_pass.py [N ...]
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import pct, table

from noduslocal.daemon.gpus.service import simulated_inventory
from noduslocal.daemon.scheduler.fairshare import Ledger
from noduslocal.daemon.scheduler.gpus import GpuPool
from noduslocal.daemon.scheduler.queue import Capacity, Limits, Queue, Request
from noduslocal.domain.gpu_request import GpuRequest

GiB = 2**30
PASSES = 20


def fair_share(rnd: random.Random) -> Ledger:
    ledger = Ledger(7 * 86400)
    now = time.time()
    for uid in range(50):
        ledger.charge(uid, rnd.random() * 100, now - rnd.random() * 86400)
    return ledger


def backfill(n: int, rnd: random.Random) -> Queue:
    ledger = fair_share(rnd)
    now = time.time()
    queue = Queue(Capacity(64_000, 512 * GiB, gpus=GpuPool(simulated_inventory("8xH100"))),
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


def walk(n: int, rnd: random.Random) -> Queue:
    ledger = fair_share(rnd)
    now = time.time()
    pool = GpuPool(simulated_inventory("8xH100,2xL4"))
    queue = Queue(Capacity(64_000, 512 * GiB, gpus=pool),
                  limits=Limits(max_gpus=8, max_jobs=64),
                  usage=lambda uid: ledger.value(uid, time.time()))
    for i in range(4):  # the H100s, held by jobs that say nothing of their end
        running = Request(i + 1, 1000, GiB, gpu=GpuRequest(2, "H100"), owner_uid=i)
        queue.capacity.take(running, started_at=now)
    queue.push(Request(100, 1000, GiB, gpu=GpuRequest(8, "H100"), owner_uid=99))
    for job_id in range(101, 101 + n):
        queue.push(Request(job_id, rnd.choice((500, 1000, 2000)), GiB,
                           gpu=GpuRequest(rnd.choice((1, 1, 2, 4)), "H100"),
                           owner_uid=rnd.randrange(50), priority=rnd.choice((0, 0, 0, 1)),
                           expected=rnd.choice((None, 600.0, 7200.0))))
    return queue


def measure(queue: Queue) -> tuple[list[float], int]:
    times = []
    started: list[Request] = []
    for _ in range(PASSES):
        t0 = time.perf_counter()
        started = queue.schedule()
        times.append(time.perf_counter() - t0)
        for req in started:  # keep the queue as it was for the next pass
            queue.capacity.give(req)
            queue.push(req)
    return times, len(started)


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1000, 10_000, 20_000, 40_000, 80_000]
    for name, build in (("backfill", backfill), ("walk", walk)):
        rows = []
        base: float | None = None
        for n in sizes:
            times, started = measure(build(n, random.Random(n)))
            p50 = pct(times, 50)
            # Time per n*log2(n): flat, or falling, when the pass grows no worse.
            unit = p50 / (n * math.log2(max(n, 2)))
            base = base or unit
            rows.append({"pending": str(n), "p50 ms": f"{p50 * 1000:.2f}",
                         "max ms": f"{max(times) * 1000:.2f}",
                         "started per pass": str(started),
                         "ns per n*log2(n)": f"{unit * 1e9:.2f}",
                         "vs first": f"{unit / base:.2f}"})
        print(f"{name}: {PASSES} passes each")
        print(table(rows))
        print()
    print("target: < 25 ms at 40,000 pending; 'vs first' <= ~1 means no worse than n log n")


if __name__ == "__main__":
    main()
