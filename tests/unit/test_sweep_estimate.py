"""Issue 28: a sweep's estimate runs its waiting cells as wide as the box can hold them,
not as max_parallel allows: 8 allowed on 2 CPUs with 1 CPU a cell is 2 at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

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


def test_cell_groups_of_alike_cells_are_what_their_specs_say(tmp_path: Path) -> None:
    """A sweep whose every cell asks what its template asks (a map, a grid over anything
    but `gpu`) has its cell groups counted without its cells' specs parsed (10 ms of the
    reader's time for a 1,000-cell sweep's status): the groups are those the specs give,
    for GPUs, model, expected duration, CPUs and memory alike; a grid over `gpu` is
    grouped from its specs as before."""
    from noduslocal.daemon.gpus.service import simulated_inventory
    from noduslocal.daemon.store.rows import asks_of
    from noduslocal.testing import lifecycle

    async def main() -> None:
        async with lifecycle(tmp_path, inventory=simulated_inventory("4xH100"), cpus=8,
                             memory=64 * 2**30) as h:
            grid = await h.create_sweep(
                "grid", canary="none", grid={"X": ["a", "b", "c"]},
                template={"command": ["train"], "gpu": "H100:2", "cpu": 0.5,
                          "memory": "1GiB", "expected_duration": 90})
            mapped = await h.create_sweep(
                "mapped", canary="none", map={"args": ["echo", ":::", "1", "2"]},
                template={"command": ["echo"], "cpu": 2})
            gpus = await h.create_sweep(
                "gpus", canary="none", grid={"gpu": ["H100", "H100:2"], "X": ["a", "b"]},
                template={"command": ["train"]})
            sweeps = [grid, mapped, gpus]
            assert [s.spec.cells_alike() for s in sweeps] == [True, True, False]
            ids, now = [s.id for s in sweeps], 1e9

            async def settled() -> dict[int, list[CellGroup]]:
                """The groups once no cell moves (compared while cells started, the two
                reads saw different phases): the fake runtime's ranks run until told to
                end, so the cells that start reach Running and stay there."""
                last = None
                for _ in range(200):
                    groups = await h.store.sweeps_cell_groups(ids, now)
                    if groups == last and all(g.phase != "Starting"
                                              for found in groups.values() for g in found):
                        return groups
                    last = groups
                    await asyncio.sleep(0.05)
                raise AssertionError(f"the cells never settled: {last}")

            parsed = await settled()
            alike = {s.id: asks_of(s.spec.template) for s in sweeps if s.spec.cells_alike()}
            assert await h.store.sweeps_cell_groups(ids, now, alike) == parsed
            assert {(g.gpus, g.model, g.expected_duration, g.cpu, g.memory)
                    for g in parsed[grid.id]} == {(2, "H100", 90, 0.5, 2**30)}
            assert len(parsed[gpus.id]) == 2  # one group per GPU request

    asyncio.run(main())
