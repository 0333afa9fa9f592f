"""The sweep controller under races: many small sweeps at once on the lifecycle harness,
with the store's reads and the answers to its commits delayed at random, cells ending at
random, and owners cancelling, suspending and resuming sweeps and cells, retrying
failed sweeps and changing max_parallel meanwhile; some sweeps gated by a smoke canary,
some waiting for a job first; a runtime that arms launches ahead (as the host's). Every
sweep must end, and each once its owners stop: a cell left in no one's books (CI's
daemon tier once), or a look left Ending, keeps one Running for good."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from noduslocal.daemon.runtime.base import ArmingRuntime, Launch, Rank
from noduslocal.domain import errors
from noduslocal.domain.states import SWEEP_TERMINAL, Phase, SweepPhase
from noduslocal.domain.sweeps import SweepRecord
from noduslocal.testing import FakeRuntime, LifecycleHarness, lifecycle

SWEEPS = 40
AGITATE = 1.0  # seconds owners act on the sweeps
SETTLE = 30.0  # seconds every sweep has to end after that


class ArmingFake(FakeRuntime):
    """The fake runtime, arming launches as the host's does: an arming takes a moment,
    may fail, and is let go when not used within a while."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self._armed: dict[tuple[int, int], asyncio.Future[bool]] = {}
        self.armed_launches = 0

    def arm(self, launch: Launch) -> bool:
        key = (launch.ref.job.id, launch.ref.number)
        if key in self._armed or len(self._armed) >= 4:
            return False
        loop = asyncio.get_running_loop()
        armed: asyncio.Future[bool] = loop.create_future()
        self._armed[key] = armed
        loop.call_later(self.rng.uniform(0, 0.004),
                        lambda: armed.set_result(self.rng.random() < 0.95))
        loop.call_later(0.5, lambda: self._armed.get(key) is armed and self._armed.pop(key))
        return True

    def armed(self, job_id: int, number: int) -> bool:
        armed = self._armed.get((job_id, number))
        return armed is not None and armed.done() and armed.result()

    def holds(self, job_id: int, number: int) -> bool:
        return (job_id, number) in self._armed

    async def launch(self, launch: Launch) -> list[Rank]:
        armed = self._armed.pop((launch.ref.job.id, launch.ref.number), None)
        if armed is not None and await armed:
            self.armed_launches += 1
        return await super().launch(launch)


def delay_reads(h: LifecycleHarness, rng: random.Random) -> None:
    """The reads the controller makes, each a little late, before or after it reads."""
    store = h.store
    for name in ("jobs_by_ids", "sweep_cells", "sweep_totals", "sweep_costs"):
        read = getattr(store, name)

        async def late(*args: Any, _read: Any = read, **kwargs: Any) -> Any:
            if rng.random() < 0.7:
                await asyncio.sleep(rng.uniform(0, 0.01))
            value = await _read(*args, **kwargs)
            if rng.random() < 0.5:
                await asyncio.sleep(rng.uniform(0, 0.01))
            return value

        setattr(store, name, late)


def delay_answers(h: LifecycleHarness, rng: random.Random) -> None:
    """Some commits answered late: the committed events go out at once, the caller
    resumes a little later (as a busy loop would have it)."""
    store = h.store
    write = store.write

    def late(op: Any, quick: bool = False, volatile: bool = False) -> asyncio.Future[Any]:
        done = write(op, quick=quick, volatile=volatile)
        if rng.random() >= 0.3:
            return done
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()

        def resolve() -> None:
            if answer.done():
                return
            if done.cancelled():
                answer.cancel()
            elif (exc := done.exception()) is not None:
                answer.set_exception(exc)
            else:
                answer.set_result(done.result())

        done.add_done_callback(lambda _: loop.call_later(rng.uniform(0, 0.01), resolve))
        return answer

    store.write = late  # type: ignore[method-assign]


async def owners(h: LifecycleHarness, sweeps: list[SweepRecord], rng: random.Random,
                 until: Callable[[], bool]) -> None:
    """Cancel, suspend and resume sweeps and cells, retry failed sweeps, change
    max_parallel, at random."""
    sweep_controls, jobs = h.lifecycle.sweep_controls, h.lifecycle.jobs
    while not until():
        await asyncio.sleep(rng.uniform(0, 0.02))
        sweep = rng.choice(sweeps)
        roll = rng.random()
        try:
            fresh = await h.sweep(sweep)
            if roll < 0.25:
                cell = rng.choice(await h.cells(sweep))
                await jobs.control(cell, "cancel")
            elif roll < 0.3:
                await sweep_controls.cancel(fresh, False)
            elif roll < 0.4:
                await sweep_controls.suspend(fresh)
                await asyncio.sleep(rng.uniform(0, 0.01))
                await sweep_controls.resume(await h.sweep(sweep))
            elif roll < 0.5 and fresh.phase == SweepPhase.FAILED:
                await sweep_controls.retry(fresh, False)
            elif roll < 0.6:
                await sweep_controls.set_max_parallel(fresh, rng.randint(1, 4))
            elif roll < 0.65:
                cell = rng.choice(await h.cells(sweep))
                await jobs.control(cell, "suspend")
                await asyncio.sleep(rng.uniform(0, 0.01))
                await jobs.control(await h.job(cell.id), "resume")
        except (errors.Conflict, errors.NotFound):
            pass  # it ended, or moved, meanwhile: as an owner would be told


async def cells_end(runtime: FakeRuntime, rng: random.Random,
                    until: Callable[[], bool]) -> None:
    """Each launched rank exits soon, one in ten failing."""
    while not until():
        for rank in list(runtime.ranks):
            if not rank.ended.done() and rng.random() < 0.3:
                rank.exit(0 if rng.random() < 0.9 else 1)
        await asyncio.sleep(rng.uniform(0, 0.005))


async def go_on(h: LifecycleHarness, sweeps: list[SweepRecord]) -> None:
    """What the owners left suspended goes on."""
    for sweep in sweeps:
        try:
            fresh = await h.sweep(sweep)
            if fresh.phase == SweepPhase.SUSPENDED:
                await h.lifecycle.sweep_controls.resume(fresh)
            for cell in await h.cells(sweep):
                if cell.phase == Phase.SUSPENDED:
                    await h.lifecycle.jobs.control(cell, "resume")
        except (errors.Conflict, errors.NotFound):
            pass


async def unended(h: LifecycleHarness, sweeps: list[SweepRecord]) -> list[str]:
    """Each sweep not ended, with its cells' phases (their reasons, and the smoke
    canary's)."""
    left = []
    for sweep in sweeps:
        fresh = await h.sweep(sweep)
        if fresh.phase in SWEEP_TERMINAL:
            continue
        ids = [j for j, _, _ in await h.store.sweep_cells(sweep.id)]
        if fresh.spec.smoke_job is not None:
            ids.append(fresh.spec.smoke_job)
        cells = [f"{c.id}:{c.phase}/{c.reason}" for c in await h.store.jobs_by_ids(ids)]
        left.append(f"{sweep.name} {fresh.phase} {cells}")
    return left


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_sweep_ends_whatever_the_order_of_reads_commits_and_controls(
        tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    runtime = ArmingFake(rng)
    assert isinstance(runtime, ArmingRuntime)

    async def main() -> None:
        async with lifecycle(tmp_path, runtime, cpus=4) as h:
            delay_reads(h, rng)
            delay_answers(h, rng)
            ending = False
            ender = asyncio.ensure_future(cells_end(runtime, rng, lambda: ending))
            sweeps: list[SweepRecord] = []

            async def create(i: int) -> None:
                grid = {"X": list(range(rng.randint(1, 5)))}
                roll = rng.random()
                fields: dict[str, Any] = ({"canary": "none"} if roll < 0.3 else
                                          {"canary_smoke": "true"} if roll < 0.5 else {})
                if rng.random() < 0.25:  # it waits for a job first
                    await h.create_job(f"before-s{i}")
                    condition = rng.choice(["afterok", "afterany"])
                    fields["template"] = {"command": ["train"],
                                          "after": [f"{condition}:before-s{i}"]}
                sweeps.append(await h.create_sweep(f"s{i}", grid=grid,
                                                   max_parallel=rng.randint(1, 3), **fields))

            acting = True
            agitator: Awaitable[None] | None = None
            for batch in range(0, SWEEPS, 5):
                await asyncio.gather(*(create(i) for i in range(batch, batch + 5)))
                if agitator is None:
                    agitator = asyncio.ensure_future(
                        owners(h, sweeps, rng, lambda: not acting))
                await asyncio.sleep(rng.uniform(0, 0.02))
            await asyncio.sleep(AGITATE)
            acting = False
            assert agitator is not None
            await agitator
            await go_on(h, sweeps)
            deadline = time.monotonic() + SETTLE
            while (left := await unended(h, sweeps)) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            ending = True
            await ender
            assert not left, (f"seed {seed}: {left} never ended; the daemon's state:\n"
                              + "\n".join(h.lifecycle.describe()))
            assert runtime.armed_launches  # the armed path was taken

    asyncio.run(main())
