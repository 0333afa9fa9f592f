"""The queue pass and stops, against the in-memory fake runtime (noduslocal.testing): what
starts and what waits for room, SIGTERM to every rank then SIGKILL after the grace, a
stop that comes before the ranks were launched or before the job left the queue, an exit
before the stop's signal landed, and a restarted lifecycle adopting what still runs. The
lifecycle parts are the daemon's own on a real SQLite store; no daemon, no processes."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from noduslocal.daemon.jobs.attempt import AttemptLife
from noduslocal.domain.states import AttemptPhase, Phase, Reason
from noduslocal.testing import FakeRuntime, LifecycleHarness, eventually, lifecycle


def run(tmp_path: Path, body: Callable[[LifecycleHarness], Awaitable[None]],
        runtime: FakeRuntime | None = None, **settings: object) -> None:
    async def main() -> None:
        async with lifecycle(tmp_path, runtime, **settings) as parts:  # type: ignore[arg-type]
            await body(parts)

    asyncio.run(main())


def test_what_fits_starts_and_the_rest_waits_for_the_room_an_end_frees(
        tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        first = await h.create_job("first", cpu=1)
        second = await h.create_job("second", cpu=1)
        third = await h.create_job("third", cpu=1)
        await h.launched(first.id)
        await h.launched(second.id)
        await eventually(lambda: h.phase_of(second.id, Phase.RUNNING), "second Running")
        # Two CPUs: the third waits in the queue, saying why, and nothing launched it.
        assert h.runtime.of(third.id) == []
        assert (await h.job(third.id)).phase == Phase.PENDING
        assert h.lifecycle.jobs.wait_reason(third.id) == "needs 1 CPU, 0 free"
        # The first's end gives its CPU to the third.
        h.runtime.of(first.id)[0].exit(0)
        await h.launched(third.id)
        done = await h.ended(first.id)
        assert (done.phase, done.reason, done.exit_code) == (Phase.SUCCEEDED,
                                                             Reason.COMPLETED, 0)
        assert h.lifecycle.jobs.wait_reason(third.id) is None

    run(tmp_path, body, cpus=2)


def test_a_higher_priority_job_starts_before_an_older_one(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        running = await h.create_job("running", cpu=1)
        await h.launched(running.id)
        older = await h.create_job("older", cpu=1)
        urgent = await h.create_job("urgent", cpu=1, priority=5)
        await eventually(lambda: h.lifecycle.jobs.wait_reason(older.id),
                         "the older job's wait reason")
        h.runtime.of(running.id)[0].exit(0)
        await h.launched(urgent.id)
        assert h.runtime.of(older.id) == []
        h.runtime.of(urgent.id)[0].exit(0)
        await h.launched(older.id)

    run(tmp_path, body, cpus=1)


def test_a_cancel_sends_sigterm_to_every_rank_then_sigkill_after_the_grace(
        tmp_path: Path) -> None:
    runtime = FakeRuntime()
    runtime.ignore_sigterm = True  # a job that traps SIGTERM and goes on

    async def body(h: LifecycleHarness) -> None:
        job = await h.create_job("stubborn", distributed={"nodes": 2})
        ranks = await h.launched(job.id, ranks=2)
        await eventually(lambda: h.phase_of(job.id, Phase.RUNNING), "Running")
        attempt = h.lifecycle.board.active[job.id]
        await h.lifecycle.controls.cancel(await h.job(job.id))
        # SIGTERM reached both ranks at once: the stop counts from here.
        assert [r.signals for r in ranks] == [[signal.SIGTERM], [signal.SIGTERM]]
        assert attempt.life is AttemptLife.STOPPING
        await eventually(lambda: all(r.done for r in ranks), "the ranks to be killed")
        assert [r.signals for r in ranks] == [[signal.SIGTERM, signal.SIGKILL]] * 2
        done = await h.ended(job.id)
        assert (done.phase, done.reason, done.exit_code) == (Phase.CANCELLED,
                                                             Reason.CANCELLED, 137)

    run(tmp_path, body, runtime, kill_grace=0.05)


def test_a_rank_that_obeys_sigterm_gets_no_sigkill(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        job = await h.create_job("obedient")
        (rank,) = await h.launched(job.id)
        await eventually(lambda: h.phase_of(job.id, Phase.RUNNING), "Running")
        await h.lifecycle.controls.suspend(await h.job(job.id))
        done = await eventually(lambda: h.phase_of(job.id, Phase.SUSPENDED), "Suspended")
        assert (done.reason, rank.signals) == (Reason.SUSPENDED, [signal.SIGTERM])
        assert job.id not in h.lifecycle.board.active  # the grace's timer went with it

    run(tmp_path, body, kill_grace=0.05)


def test_a_stop_before_the_ranks_are_launched_reaches_them_as_they_come(
        tmp_path: Path) -> None:
    runtime = FakeRuntime()

    async def body(h: LifecycleHarness) -> None:
        runtime.hold_launches()
        job = await h.create_job("early")
        await eventually(lambda: job.id in runtime.waiting, "its launch to begin")
        attempt = h.lifecycle.board.active[job.id]
        assert attempt.life is AttemptLife.STARTING
        await h.lifecycle.controls.cancel(await h.job(job.id))
        # Nothing to signal yet: the stop is due, and counts however the ranks end.
        assert attempt.life is AttemptLife.STOP_DUE
        assert runtime.signals(job.id) == []
        runtime.release_launches()
        (rank,) = await h.launched(job.id)
        done = await h.ended(job.id)
        assert rank.signals == [signal.SIGTERM]
        assert (done.phase, done.reason) == (Phase.CANCELLED, Reason.CANCELLED)
        (recorded,) = await h.store.attempts(job.id)
        assert (recorded.phase, recorded.exit_code) == (AttemptPhase.EXITED, 143)

    run(tmp_path, body, runtime)


def test_a_stop_of_a_job_still_in_the_queue_launches_nothing(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        blocker = await h.create_job("blocker", cpu=1)
        await h.launched(blocker.id)
        queued = await h.create_job("queued", cpu=1)
        await eventually(lambda: h.lifecycle.jobs.wait_reason(queued.id), "it to wait")
        await h.lifecycle.controls.cancel(await h.job(queued.id))
        done = await h.ended(queued.id)
        assert (done.phase, done.reason, done.message) == (
            Phase.CANCELLED, Reason.CANCELLED, "cancelled before it started")
        assert await h.store.attempts(queued.id) == []
        h.runtime.of(blocker.id)[0].exit(0)
        await h.ended(blocker.id)
        assert h.runtime.of(queued.id) == []

    run(tmp_path, body, cpus=1)


def test_an_exit_before_the_stop_signal_lands_is_the_jobs_own(tmp_path: Path) -> None:
    runtime = FakeRuntime()

    async def body(h: LifecycleHarness) -> None:
        job = await h.create_job("quick")
        (rank,) = await h.launched(job.id)
        await eventually(lambda: h.phase_of(job.id, Phase.RUNNING), "Running")
        runtime.unreachable = "the fake runtime is away"  # the SIGTERM cannot land
        await h.lifecycle.controls.cancel(await h.job(job.id))
        attempt = h.lifecycle.board.active[job.id]
        assert attempt.life is AttemptLife.STOP_ASKED
        rank.exit(0)  # it finished on its own meanwhile
        done = await h.ended(job.id)
        assert (done.phase, done.reason, done.exit_code) == (Phase.SUCCEEDED,
                                                             Reason.COMPLETED, 0)
        assert rank.signals == []

    run(tmp_path, body, runtime)


def test_a_restarted_lifecycle_adopts_what_runs_and_stops_it_as_recorded(
        tmp_path: Path) -> None:
    runtime = FakeRuntime()
    runtime.ignore_sigterm = True

    async def main() -> None:
        async with lifecycle(tmp_path, runtime, kill_grace=0.05) as first:
            job = await first.create_job("kept")
            (rank,) = await first.launched(job.id)
            await eventually(lambda: first.phase_of(job.id, Phase.RUNNING), "Running")
            runtime.unreachable = "the fake runtime is away"
            await first.lifecycle.controls.cancel(await first.job(job.id))
            assert rank.signals == []  # recorded, not delivered: the daemon goes down
        runtime.unreachable = None
        async with lifecycle(tmp_path, runtime, kill_grace=0.05) as second:
            done = await second.ended(job.id)
            assert ("adopt", (job.id, 1, [rank.handle.ref], True, True)) in runtime.calls
            # Adopted as stopping: the stop is sent again, and SIGKILL after the grace.
            assert rank.signals == [signal.SIGTERM, signal.SIGKILL]
            assert (done.phase, done.reason, done.attempts) == (Phase.CANCELLED,
                                                                Reason.CANCELLED, 1)
            assert [c for c, _ in runtime.calls].count("launch") == 1

    asyncio.run(main())


def test_a_kicked_pass_runs_once_for_what_changed_and_not_after_a_pass_saw_it(
        tmp_path: Path) -> None:
    """A kick queues a pass; an end's pass (release()) that runs before it sees what the
    kick was for, so the kicked one does nothing: a sweep's next cell is queued as its
    last one ends, just before that end's pass, and every task paid a second, empty pass
    (issue 25, part 5). A kick after a pass still gets its own."""
    async def body(h: LifecycleHarness) -> None:
        dispatch = h.lifecycle.dispatch
        passes: list[int] = []
        schedule = dispatch.queue.schedule

        def counted() -> list[Any]:
            passes.append(1)
            return schedule()

        dispatch.queue.schedule = counted  # type: ignore[method-assign]
        running = await h.create_job("running", cpu=1)
        await h.launched(running.id)
        await eventually(lambda: h.phase_of(running.id, Phase.RUNNING), "Running")
        await asyncio.sleep(0.05)
        passes.clear()
        waiting = await h.create_job("waiting", cpu=1)  # kicks a pass: no room yet
        await eventually(lambda: len(passes) == 1, "the kicked pass")
        dispatch.kick()
        dispatch.run_pass()  # as an end's release() does before the kicked pass runs
        await asyncio.sleep(0.05)
        assert len(passes) == 2  # before: 3, the kicked one run after the direct one
        dispatch.kick()
        await eventually(lambda: len(passes) == 3, "the next kick's pass")
        h.runtime.of(running.id)[0].exit(0)
        await h.launched(waiting.id)

    run(tmp_path, body, cpus=1)


def test_a_job_taken_out_of_the_queue_lets_what_waited_behind_it_start(
        tmp_path: Path) -> None:
    """The head of the queue holds back what would take the room it waits for; taken out
    (a cancel, a sweep's suspend putting its cell back among the held ones), a pass must
    follow, or the job behind it waits for an unrelated event. A sweep's suspend took
    cells out without one: a kick queued for something else used to cover it."""
    async def body(h: LifecycleHarness) -> None:
        running = await h.create_job("running", cpu=1)
        await h.launched(running.id)
        await eventually(lambda: h.phase_of(running.id, Phase.RUNNING), "Running")
        head = await h.create_job("head", cpu=2)
        behind = await h.create_job("behind", cpu=1)
        await eventually(lambda: h.lifecycle.jobs.wait_reason(behind.id) is not None,
                         "the job behind the head to wait")
        await asyncio.sleep(0.05)
        assert h.runtime.of(behind.id) == []
        assert h.lifecycle.dispatch.remove(head.id)
        await h.launched(behind.id)

    run(tmp_path, body, cpus=2)
