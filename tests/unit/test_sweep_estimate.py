"""Issue 28: a sweep's estimate runs its waiting cells as wide as the box can hold them,
not as max_parallel allows: 8 allowed on 2 CPUs with 1 CPU a cell is 2 at once."""

from __future__ import annotations

from noduslocal.daemon.store.rows import CellGroup
from noduslocal.daemon.sweeps.reports import estimate


def groups(cpu: float = 1.0, memory: int = 0, gpus: int = 0) -> list[CellGroup]:
    done = CellGroup("Succeeded", gpus, None, None, 2, wall=20.0, ran=2, started=0.0,
                     cpu=cpu, memory=memory)  # 10 s a cell
    waiting = CellGroup("Pending", gpus, None, None, 8, wall=0.0, ran=0, started=0.0,
                        cpu=cpu, memory=memory)
    return [done, waiting]


def width(doc: dict[str, object]) -> str:
    return str(doc["basis"]).rsplit(", ", 1)[1]


def test_the_box_s_cpus_bound_the_width() -> None:
    doc = estimate(groups(), 0.0, 0.0, lambda _: 0.0, 8, 0, 1000.0, box_cpu=2.0,
                   box_memory=8 << 30)
    assert width(doc) == "2 cells at once"
    assert doc["finish_in_s"] == 40.0  # 8 cells, 2 at a time, 10 s each


def test_memory_and_gpus_bound_it_too_and_max_parallel_still_does() -> None:
    by_memory = estimate(groups(memory=3 << 30), 0.0, 0.0, lambda _: 0.0, 8, 0, 1000.0,
                         box_cpu=16.0, box_memory=8 << 30)
    assert width(by_memory) == "2 cells at once"
    by_gpus = estimate(groups(gpus=2), 0.0, 0.0, lambda _: 0.0, 8, 4, 1000.0, box_cpu=16.0,
                       box_memory=64 << 30)
    assert width(by_gpus) == "2 cells at once"
    by_limit = estimate(groups(), 0.0, 0.0, lambda _: 0.0, 3, 0, 1000.0, box_cpu=64.0,
                        box_memory=64 << 30)
    assert width(by_limit) == "3 cells at once"
