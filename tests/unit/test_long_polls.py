"""Long polls (`job wait`, `sweep wait`) on the event hub: they return at the change they
wait for, or at their timeout with the state as it is then, and leave nothing behind
either way: no waiter per timed-out or abandoned poll piling up until the next change.
Through the services the API calls, on the lifecycle parts with the in-memory fake
runtime; no daemon, no processes."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from pathlib import Path

from noduslocal.domain.states import Phase, SweepPhase
from noduslocal.testing import LifecycleHarness, eventually, lifecycle

POLLS = 200
ABANDONED = 200
QUIET = {"disk_poll": 3600.0, "gpu_poll": 3600.0, "du_every": 3600.0, "gc_every": 3600.0}


def run(tmp_path: Path, body: Callable[[LifecycleHarness], Awaitable[None]]) -> None:
    async def main() -> None:
        async with lifecycle(tmp_path, **QUIET) as parts:  # type: ignore[arg-type]
            await body(parts)

    asyncio.run(main())


def pending_futures() -> int:
    """Futures (not tasks) alive and not done: what a waiter left behind would be."""
    gc.collect()
    return sum(1 for o in gc.get_objects()
               if isinstance(o, asyncio.Future) and not isinstance(o, asyncio.Task)
               and not o.done())


async def no_waiter_per_poll(h: LifecycleHarness, before: int, polls: int) -> None:
    """No poll still registered with the hub, and fewer than half a pending future per
    poll more than `before` once what is in flight (a commit, a read on the store's
    thread) is done: a waiter left behind by each poll stays for good, while the
    lifecycle's own work may add a few futures meanwhile (a running attempt's metrics
    follower begins after FOLLOW_AFTER; under CI's load the polls outlasted it: 12
    against 10 with two attempts, 9 against 8 with one)."""
    assert h.hub.waiters() == 0
    await eventually(lambda: pending_futures() < before + polls // 2,
                     f"fewer than {before + polls // 2} pending futures after {polls} polls "
                     f"({pending_futures()} at first, {before} before)", 10.0)


def test_timed_out_sweep_polls_leave_no_waiter_behind(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("slow", grid={"X": [1, 2]}, canary="none")
        for cell in await h.cells(sweep):
            await h.launched(cell.id)
            await eventually(lambda c=cell: h.phase_of(c.id, Phase.RUNNING), "Running")
        sweeps = h.lifecycle.sweep_service
        await sweeps.wait(sweep, 0.0)  # whatever the first poll makes once
        before = pending_futures()
        for _ in range(POLLS):
            polled = await sweeps.wait(sweep, 0.001)
            assert polled.phase == SweepPhase.RUNNING
        await no_waiter_per_poll(h, before, POLLS)

    run(tmp_path, body)


def test_abandoned_sweep_polls_leave_no_waiter_behind(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("left", grid={"X": [1]}, canary="none")
        (cell,) = await h.cells(sweep)
        await h.launched(cell.id)
        await eventually(lambda: h.phase_of(cell.id, Phase.RUNNING), "Running")
        sweeps = h.lifecycle.sweep_service
        await sweeps.wait(sweep, 0.0)
        before = pending_futures()
        for _ in range(ABANDONED):  # the client went away: its handler is cancelled mid-poll
            poll = asyncio.ensure_future(sweeps.wait(sweep, 60.0))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            poll.cancel()
            await asyncio.gather(poll, return_exceptions=True)
        await no_waiter_per_poll(h, before, ABANDONED)

    run(tmp_path, body)


def test_timed_out_job_polls_leave_no_waiter_behind(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        job = await h.create_job("slow")
        await h.launched(job.id)
        await eventually(lambda: h.phase_of(job.id, Phase.RUNNING), "Running")
        jobs = h.lifecycle.jobs
        await jobs.wait(await h.job(job.id), 0.0)
        before = pending_futures()
        for _ in range(POLLS):
            polled = await jobs.wait(await h.job(job.id), 0.001)
            assert polled.phase == Phase.RUNNING
        await no_waiter_per_poll(h, before, POLLS)

    run(tmp_path, body)


def test_abandoned_job_polls_leave_no_waiter_behind(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        job = await h.create_job("left")
        await h.launched(job.id)
        await eventually(lambda: h.phase_of(job.id, Phase.RUNNING), "Running")
        jobs = h.lifecycle.jobs
        await jobs.wait(await h.job(job.id), 0.0)
        before = pending_futures()
        for _ in range(ABANDONED):  # the client went away: its handler is cancelled mid-poll
            poll = asyncio.ensure_future(jobs.wait(await h.job(job.id), 60.0))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            poll.cancel()
            await asyncio.gather(poll, return_exceptions=True)
        await no_waiter_per_poll(h, before, ABANDONED)

    run(tmp_path, body)


def test_a_sweep_poll_returns_at_the_sweeps_end_through_its_transitions(
        tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("gated", grid={"X": [1, 2]})
        cells = await h.cells(sweep)
        poll = asyncio.ensure_future(h.lifecycle.sweep_service.wait(sweep, 60.0))
        (canary,) = await h.launched(cells[0].id)
        canary.exit(0)  # Canary -> Running wakes the poll, which waits on
        (other,) = await h.launched(cells[1].id)
        assert not poll.done()
        other.exit(0)
        done = await asyncio.wait_for(poll, 30.0)
        assert done.phase == SweepPhase.SUCCEEDED

    run(tmp_path, body)


def test_a_job_poll_returns_at_the_jobs_end(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        job = await h.create_job("watched")
        poll = asyncio.ensure_future(h.lifecycle.jobs.wait(job, 60.0))
        (rank,) = await h.launched(job.id)
        assert not poll.done()
        rank.exit(2)
        done = await asyncio.wait_for(poll, 30.0)
        assert (done.phase, done.exit_code) == (Phase.FAILED, 2)

    run(tmp_path, body)
