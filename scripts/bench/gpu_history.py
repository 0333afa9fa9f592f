"""The GPU history's cost (GET /v1/gpus/history): the memory of its rings with 8 GPUs
filled for an hour (more readings than fit, so every ring has wrapped), measured with
tracemalloc and as the arrays' own buffers; the time to record one reading of the 8 GPUs
(once per gpu_poll, on the daemon's loop); and the time to build the full response (the
columns, on the loop) and encode it as JSON (on a thread), with its size. At the default
gpu_poll (2 s), and at 0.1 s, where a ring reaches its cap of samples.

    python scripts/bench/gpu_history.py [GPUS]     issue 27: memory for 8 GPUs over an hour
"""

from __future__ import annotations

import json
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import summary_ms, table

from noduslocal.daemon.gpus.history import WINDOW, GpuHistory
from noduslocal.daemon.gpus.model import Gpu, Inventory

GiB = 2**30
REPEATS = 30
START = 1_765_000_000.0


def box(n: int) -> list[Gpu]:
    return [Gpu(i, f"GPU-{i:08x}-0000-4000-8000-{i:012x}", "NVIDIA H100 80GB HBM3",
                f"00000000:{0x18 + i:02X}:00.0", 80 * GiB) for i in range(n)]


def reading(gpus: list[Gpu], at: float, rng: random.Random) -> Inventory:
    for gpu in gpus:  # values of a busy box: every column varies
        gpu.utilization = rng.randrange(101)
        gpu.memory_used = rng.randrange(80 * GiB)
        gpu.power_mw = rng.randrange(60_000, 700_000)
    return Inventory(gpus, "nvml", read_at=at)


def measure(n: int, period: float) -> dict[str, str]:
    rng = random.Random(27)
    gpus = box(n)
    held = {g.uuid for g in gpus[: n // 2]}
    polls = int(WINDOW / period * 1.1)  # past capacity: every ring has wrapped
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    history = GpuHistory(period, lambda: held)
    at = START
    for _ in range(polls):
        at += period
        history.record(reading(gpus, at, rng))
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    record_s = []
    for _ in range(REPEATS):
        at += period
        inventory = reading(gpus, at, rng)
        started = time.perf_counter()
        history.record(inventory)
        record_s.append(time.perf_counter() - started)
    now = Inventory(gpus, "nvml", read_at=at)
    build_s, encode_s, size = [], [], 0
    for _ in range(REPEATS):
        started = time.perf_counter()
        doc = history.view(now, now=at)
        built = time.perf_counter()
        body = json.dumps(doc).encode()
        build_s.append(built - started)
        encode_s.append(time.perf_counter() - built)
        size = len(body)
    samples = len(doc["gpus"][0]["t"])
    record, build, encode = summary_ms(record_s), summary_ms(build_s), summary_ms(encode_s)
    return {"gpu_poll s": f"{period:g}", "GPUs": str(n), "samples/GPU": str(samples),
            "arrays KiB": f"{history.nbytes() / 1024:.0f}",
            "tracemalloc KiB": f"{traced / 1024:.0f}",
            "B/sample": f"{traced / (n * history.capacity):.1f}",
            "record p50 ms": record["p50 ms"], "build p50 ms": build["p50 ms"],
            "build p99 ms": build["p99 ms"], "json p50 ms": encode["p50 ms"],
            "json p99 ms": encode["p99 ms"], "body KiB": f"{size / 1024:.0f}"}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    print(table([measure(n, 2.0), measure(n, 0.1)]))


if __name__ == "__main__":
    main()
