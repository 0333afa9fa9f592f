"""The sweep controller (sweeps/controller.py) against the in-memory fake runtime
(noduslocal.testing): the canary gates the cells, cells are released up to max_parallel in
cell order, a failing canary cancels the rest, a failed cell fails the sweep at its end, a
resumed cell goes back among the unreleased ones, releases within a max_cost; and the
moves its async looks (settle, budget) allow. The lifecycle parts are the daemon's own on
a real SQLite store; no daemon, no processes."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from noduslocal.daemon.store import Store
from noduslocal.daemon.store import sweeps as sweep_ops
from noduslocal.daemon.sweeps.state import (
    BUDGET_TRANSITIONS,
    SETTLE_TRANSITIONS,
    ActiveSweep,
    BudgetLook,
    SettleLook,
    check_budget_transition,
    check_settle_transition,
)
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.states import IllegalTransition, Phase, Reason, SweepPhase
from noduslocal.domain.sweeps import SweepRecord
from noduslocal.testing import LifecycleHarness, eventually, lifecycle


def run(tmp_path: Path, body: Callable[[LifecycleHarness], Awaitable[None]],
        **settings: object) -> None:
    async def main() -> None:
        async with lifecycle(tmp_path, **settings) as parts:  # type: ignore[arg-type]
            await body(parts)

    asyncio.run(main())


async def in_phase(h: LifecycleHarness, sweep: SweepRecord, phase: SweepPhase
                   ) -> SweepRecord:
    async def look() -> SweepRecord | None:
        fresh = await h.sweep(sweep)
        return fresh if fresh.phase == phase else None

    return await eventually(look, f"sweep {sweep.name} to be {phase}")


def launched_cells(h: LifecycleHarness, cells: list[JobRecord]) -> list[int]:
    """The cells (by index) the runtime was asked to launch."""
    return [i for i, cell in enumerate(cells) if h.runtime.of(cell.id)]


def count_writes(store: Store) -> tuple[list[object], Callable[[], None]]:
    """Every operation asked of the store's writer from now on, and the function that
    stops counting."""
    writes: list[object] = []
    write = store.write

    def counted(op: Any, *args: Any, **kwargs: Any) -> Any:
        writes.append(op)
        return write(op, *args, **kwargs)

    def stop() -> None:
        store.write = write  # type: ignore[method-assign]

    store.write = counted  # type: ignore[method-assign]
    return writes, stop


def test_the_canary_gates_the_cells_then_they_run_max_parallel_at_a_time(
        tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("grid", grid={"X": [1, 2, 3, 4, 5]}, max_parallel=2)
        cells = await h.cells(sweep)
        assert (await h.sweep(sweep)).phase == SweepPhase.CANARY
        (canary,) = await h.launched(cells[0].id)
        # Only the canary runs; the others wait, saying for what.
        assert launched_cells(h, cells) == [0]
        for cell in cells[1:]:
            assert h.lifecycle.jobs.wait_reason(cell.id) == (
                "sweep grid: waiting for its canary (cell 0) to succeed")
        canary.exit(0)
        passed = await in_phase(h, sweep, SweepPhase.RUNNING)
        assert passed.reason == Reason.CANARY_PASSED
        await h.launched(cells[1].id)
        await h.launched(cells[2].id)
        assert launched_cells(h, cells) == [0, 1, 2]
        assert h.lifecycle.jobs.wait_reason(cells[3].id) == (
            "sweep grid: 2 of 2 cells running (max_parallel)")
        # A cell's end makes room for the next in order.
        h.runtime.of(cells[2].id)[0].exit(0)
        await h.launched(cells[3].id)
        assert launched_cells(h, cells) == [0, 1, 2, 3]
        active = h.lifecycle.sweeps.active(sweep.id)
        assert active is not None and active.settle is SettleLook.IDLE
        for index in (1, 3):
            h.runtime.of(cells[index].id)[0].exit(0)
        (last,) = await h.launched(cells[4].id)
        last.exit(0)
        done = await in_phase(h, sweep, SweepPhase.SUCCEEDED)
        assert (done.reason, done.message) == (Reason.COMPLETED, "all 5 cells succeeded")
        # Its end was worked out by the settle look, and the controller let go of it.
        assert active.settle is SettleLook.ENDING
        assert h.lifecycle.sweeps.active(sweep.id) is None
        assert all(len(h.runtime.of(cell.id)) == 1 for cell in cells)

    run(tmp_path, body)


def test_a_failing_canary_fails_the_sweep_and_nothing_else_runs(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("doomed", grid={"X": [1, 2, 3, 4]}, max_parallel=4)
        cells = await h.cells(sweep)
        (canary,) = await h.launched(cells[0].id)
        canary.exit(3)
        failed = await in_phase(h, sweep, SweepPhase.FAILED)
        assert failed.reason == Reason.CANARY_FAILED
        assert failed.message == ("the canary (cell 0) ended Failed: exited with code 3; "
                                  "nothing else ran")
        for cell in cells[1:]:
            fresh = await h.job(cell.id)
            assert (fresh.phase, fresh.reason) == (Phase.CANCELLED, Reason.CANARY_FAILED)
        assert launched_cells(h, cells) == [0]

    run(tmp_path, body)


def test_a_smoke_canary_gates_every_cell(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("smoked", grid={"X": [1, 2]}, canary_smoke="true")
        cells = await h.cells(sweep)
        smoke = await h.store.job(sweep.project, "smoked-canary")
        assert smoke is not None
        (rank,) = await h.launched(smoke.id)
        assert launched_cells(h, cells) == []
        assert h.lifecycle.jobs.wait_reason(cells[0].id) == (
            "sweep smoked: waiting for its smoke canary to succeed")
        rank.exit(0)
        await in_phase(h, sweep, SweepPhase.RUNNING)
        for cell in cells:
            (ran,) = await h.launched(cell.id)
            ran.exit(0)
        await in_phase(h, sweep, SweepPhase.SUCCEEDED)

    run(tmp_path, body)


def test_a_failed_cell_fails_the_sweep_once_every_cell_ended(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("mixed", grid={"X": [1, 2, 3]}, canary="none",
                                     max_parallel=3)
        assert (await h.sweep(sweep)).phase == SweepPhase.RUNNING
        cells = await h.cells(sweep)
        ranks = [(await h.launched(cell.id))[0] for cell in cells]
        ranks[1].exit(1)
        ranks[0].exit(0)
        await h.ended(cells[1].id)
        assert (await h.sweep(sweep)).phase == SweepPhase.RUNNING  # one still runs
        ranks[2].exit(0)
        done = await in_phase(h, sweep, SweepPhase.FAILED)
        assert (done.reason, done.message) == (Reason.CELLS_FAILED,
                                               "1 of 3 cells did not succeed")

    run(tmp_path, body)


def test_a_suspended_cell_holds_the_end_and_resumed_goes_back_among_the_unreleased(
        tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("paused", grid={"X": [1, 2, 3]}, canary="none",
                                     max_parallel=1)
        cells = await h.cells(sweep)
        await h.launched(cells[0].id)
        await eventually(lambda: h.phase_of(cells[0].id, Phase.RUNNING), "cell 0 Running")
        await h.lifecycle.controls.suspend(await h.job(cells[0].id))
        await eventually(lambda: h.phase_of(cells[0].id, Phase.SUSPENDED), "cell 0 aside")
        # Its room went to the next cell.
        (second,) = await h.launched(cells[1].id)
        await h.lifecycle.controls.resume(await h.job(cells[0].id))
        # Back among the unreleased cells, ahead of cell 2 but behind max_parallel.
        assert h.lifecycle.jobs.wait_reason(cells[0].id) == (
            "sweep paused: 1 of 1 cells running (max_parallel)")
        assert len(h.runtime.of(cells[0].id)) == 1  # its one attempt, suspended
        second.exit(0)
        await eventually(lambda: len(h.runtime.of(cells[0].id)) == 1
                         and h.runtime.of(cells[0].id)[0].number == 2, "cell 0 again")
        assert launched_cells(h, cells) == [0, 1]
        h.runtime.of(cells[0].id)[0].exit(0)
        (third,) = await h.launched(cells[2].id)
        third.exit(0)
        await in_phase(h, sweep, SweepPhase.SUCCEEDED)

    run(tmp_path, body)


def test_cells_all_let_go_but_one_suspended_settle_nothing_until_it_ends(
        tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("waits", grid={"X": [1, 2]}, canary="none")
        cells = await h.cells(sweep)
        first, second = [(await h.launched(cell.id))[0] for cell in cells]
        await eventually(lambda: h.phase_of(cells[0].id, Phase.RUNNING), "cell 0 Running")
        await h.lifecycle.controls.suspend(await h.job(cells[0].id))
        await eventually(lambda: h.phase_of(cells[0].id, Phase.SUSPENDED), "cell 0 aside")
        active = h.lifecycle.sweeps.active(sweep.id)
        assert active is not None
        second.exit(0)
        await h.ended(cells[1].id)
        # The look ran (the end's commit started it) and found a cell not ended.
        await eventually(lambda: active.settle is SettleLook.IDLE, "the look to end")
        assert (await h.sweep(sweep)).phase == SweepPhase.RUNNING
        await h.lifecycle.controls.resume(await h.job(cells[0].id))
        await eventually(lambda: h.runtime.of(cells[0].id)[0].number == 2, "cell 0 again")
        h.runtime.of(cells[0].id)[0].exit(0)
        await in_phase(h, sweep, SweepPhase.SUCCEEDED)
        assert first.signals  # it was stopped by the suspend

    run(tmp_path, body)


async def look_held_at_its_read(h: LifecycleHarness, sweep: SweepRecord,
                                ) -> tuple[ActiveSweep, asyncio.Event, Callable[[], None]]:
    """The one cell of `sweep` ends, and its settle look is held at its read of the totals
    until the event returned is set; the function returned puts the store's read back."""
    (cell,) = await h.cells(sweep)
    (rank,) = await h.launched(cell.id)
    active = h.lifecycle.sweeps.active(sweep.id)
    assert active is not None
    store = h.store
    reading, read = asyncio.Event(), asyncio.Event()
    totals = store.sweep_totals

    async def held_totals(sweep_id: int) -> Any:
        reading.set()
        await read.wait()
        return await totals(sweep_id)

    store.sweep_totals = held_totals  # type: ignore[method-assign]
    rank.exit(0)
    await asyncio.wait_for(reading.wait(), 10)  # the look reads: the cell has ended

    def restore() -> None:
        store.sweep_totals = totals  # type: ignore[method-assign]

    return active, read, restore


def test_an_end_that_a_suspend_came_before_is_worked_out_again_after_the_resume(
        tmp_path: Path) -> None:
    """The settle look's end and a suspend both move the Running sweep: the suspend's
    commit lands first, so the end is not applied. The look goes back to idle, and the
    resume ends the sweep (it had stayed Running for good, its look Ending)."""
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("raced", grid={"X": [1]}, canary="none")
        active, read, restore = await look_held_at_its_read(h, sweep)
        store = h.store
        # Another connection holds the write lock: the suspend's commit waits for it.
        blocker = sqlite3.connect(store.path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        writes, stop_counting = count_writes(store)
        suspend = asyncio.ensure_future(h.lifecycle.sweep_controls.suspend(
            await h.sweep(sweep)))
        await eventually(lambda: writes, "the suspend's commit asked for")
        read.set()  # the look's end is asked for while the suspend's is not committed
        await eventually(lambda: len(writes) == 2, "the look's end asked for")
        stop_counting()
        blocker.execute("COMMIT")
        blocker.close()
        await suspend
        restore()
        assert (await h.sweep(sweep)).phase == SweepPhase.SUSPENDED
        await eventually(lambda: active.settle is SettleLook.IDLE, "the look idle again")
        await h.lifecycle.sweep_controls.resume(await h.sweep(sweep))
        await in_phase(h, sweep, SweepPhase.SUCCEEDED)

    run(tmp_path, body)


def test_a_sweep_suspended_while_its_end_is_worked_out_ends_after_its_resume(
        tmp_path: Path) -> None:
    """Suspended (committed) while the look reads that every cell ended: not ended while
    suspended (Suspended -> Succeeded is no transition; the look's task died of it and the
    sweep stayed Running for good after the resume), and ended once resumed."""
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("paused", grid={"X": [1]}, canary="none")
        active, read, restore = await look_held_at_its_read(h, sweep)
        await h.lifecycle.sweep_controls.suspend(await h.sweep(sweep))
        restore()
        read.set()
        await eventually(lambda: active.settle is SettleLook.IDLE, "the look idle again")
        assert (await h.sweep(sweep)).phase == SweepPhase.SUSPENDED
        await h.lifecycle.sweep_controls.resume(await h.sweep(sweep))
        await in_phase(h, sweep, SweepPhase.SUCCEEDED)

    run(tmp_path, body)


async def asked_for_after_the_canary_s_pass(h: LifecycleHarness, canary_cell: JobRecord,
                                           canary: Any, act: Callable[[], Awaitable[None]],
                                           ) -> None:
    """The canary succeeds; its pass's commit is asked for, and held back (another
    connection holds the write lock) until `act` has asked for its own commit after it:
    the pass lands first, so `act`'s transition, made from Canary, is not applied."""
    store = h.store
    blocker = sqlite3.connect(store.path, isolation_level=None)
    writes, stop_counting = count_writes(store)
    blocked_at: list[int] = []

    def block_at_the_canary_s_end(events: list[Any]) -> None:
        if any(e.job_id == canary_cell.id and e.phase == Phase.SUCCEEDED for e in events):
            blocker.execute("BEGIN IMMEDIATE")
            blocked_at.append(len(writes))

    h.hub.listen(block_at_the_canary_s_end)
    canary.exit(0)
    await eventually(lambda: blocked_at and len(writes) == blocked_at[0] + 1,
                     "the pass's commit asked for")
    acting = asyncio.ensure_future(act())
    await eventually(lambda: len(writes) == blocked_at[0] + 2, "the act's commit asked for")
    stop_counting()
    blocker.execute("COMMIT")
    blocker.close()
    await acting


def test_each_cell_is_read_once_and_none_waits_for_its_read(tmp_path: Path) -> None:
    """A sweep without code reads its held cells ahead, in batches, before they run out:
    each cell once (a second look, asked for while the first one's read was under way,
    read the same cells again: 1,598 rows for a 1,000-cell map), and no released cell has
    to be read before it is queued (issue 25, part 5)."""
    async def body(h: LifecycleHarness) -> None:
        read: list[int] = []
        jobs_by_ids = h.store.jobs_by_ids

        async def counting(ids: list[int]) -> list[JobRecord]:
            read.extend(ids)
            return await jobs_by_ids(ids)

        h.store.jobs_by_ids = counting  # type: ignore[method-assign]
        sweep = await h.create_sweep("many", grid={"X": list(range(200))}, canary="none",
                                     max_parallel=2)
        unread_releases = []
        release = h.lifecycle.sweeps.release

        def watching(a: ActiveSweep) -> None:
            before = set(a.releasing)
            release(a)
            unread_releases.extend(a.releasing - before)

        h.lifecycle.sweeps.release = watching  # type: ignore[method-assign]
        ids = [job_id for job_id, _, _ in await h.store.sweep_cells(sweep.id)]
        for job_id in ids:
            (await h.launched(job_id))[0].exit(0)
        await in_phase(h, sweep, SweepPhase.SUCCEEDED)
        again = sorted(j for j in ids if read.count(j) > 1)
        assert not again, f"{len(again)} cells read more than once: {again[:10]}"
        assert not unread_releases, f"released before their read: {unread_releases[:10]}"

    run(tmp_path, body)


def test_a_retry_acted_on_before_the_failed_end_was_answered_still_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's Failed end is committed, and its owner's retry acted on, before the
    end's own answer came back (a busy loop): the late answer must not take the retried
    sweep out of the controller's books. It did (CI's unit tier, the race test): the
    retried cells ran and succeeded, and the sweep stayed Running for good."""
    moved_to: list[str] = []
    move = sweep_ops.move_sweep

    def recording_move(conn: sqlite3.Connection, sweep_id: int, phase: SweepPhase,
                       *args: Any, **kwargs: Any) -> Any:
        moved_to.append(phase)
        return move(conn, sweep_id, phase, *args, **kwargs)

    monkeypatch.setattr(sweep_ops, "move_sweep", recording_move)

    async def body(h: LifecycleHarness) -> None:
        store, held, answer_now = h.store, [], asyncio.Event()
        write, answering = store.write, []

        def holding_the_failed_end(op: Any, **kwargs: Any) -> asyncio.Future[Any]:
            seen, done = len(moved_to), write(op, **kwargs)
            if held:
                return done
            answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

            async def late() -> None:
                try:
                    value = await done  # its op ran at the commit: what it moved is known
                except Exception as exc:
                    answer.set_exception(exc)
                    return
                if SweepPhase.FAILED in moved_to[seen:] and not held:
                    held.append(True)
                    await answer_now.wait()
                answer.set_result(value)

            answering.append(asyncio.ensure_future(late()))
            return answer

        store.write = holding_the_failed_end  # type: ignore[method-assign]
        sweep = await h.create_sweep("again", grid={"X": [1]}, canary="none")
        [cell] = await h.cells(sweep)
        (await h.launched(cell.id))[0].exit(1)
        failed = await in_phase(h, sweep, SweepPhase.FAILED)  # committed, not answered
        await eventually(lambda: held, "the end's answer held back")
        await h.lifecycle.sweep_controls.retry(failed, False)
        answer_now.set()
        [retried] = await h.cells(sweep)
        assert retried.id != cell.id
        (await h.launched(retried.id))[0].exit(0)
        await in_phase(h, sweep, SweepPhase.SUCCEEDED)

    run(tmp_path, body)


def test_a_cancel_that_the_canary_s_pass_came_before_still_cancels_every_cell(
        tmp_path: Path) -> None:
    """The cancel takes the held cells out of the sweep's books and asks for its end; the
    canary's pass, asked for first, commits first. The cancel is made again from Running:
    the sweep ends Cancelled with its held cell (the cell had stayed Pending for good, in
    no one's books, and the sweep Running: CI's daemon tier,
    test_the_same_key_gives_the_same_sweep's teardown)."""
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("passed", grid={"X": [1, 2]})
        canary_cell, held_cell = await h.cells(sweep)
        (canary,) = await h.launched(canary_cell.id)
        await asked_for_after_the_canary_s_pass(
            h, canary_cell, canary,
            lambda: h.lifecycle.sweep_controls.cancel(sweep, False))
        ended = await in_phase(h, sweep, SweepPhase.CANCELLED)
        assert ended.reason == Reason.CANCELLED
        assert (await h.job(held_cell.id)).phase == Phase.CANCELLED
        assert not h.runtime.of(held_cell.id)

    run(tmp_path, body)


def test_a_suspend_that_the_canary_s_pass_came_before_still_suspends(
        tmp_path: Path) -> None:
    """As the cancel: the suspend is made again from Running (it had left the sweep
    Running, releasing cells, with the suspend answered); the cell the pass released is
    stopped and runs again after the resume."""
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("paused", grid={"X": [1, 2]})
        canary_cell, held_cell = await h.cells(sweep)
        (canary,) = await h.launched(canary_cell.id)
        await asked_for_after_the_canary_s_pass(
            h, canary_cell, canary, lambda: h.lifecycle.sweep_controls.suspend(sweep))
        assert (await h.sweep(sweep)).phase == SweepPhase.SUSPENDED
        # The pass released the cell first: stopped by the suspend, kept Suspended.
        await eventually(lambda: h.phase_of(held_cell.id, Phase.SUSPENDED), "it aside")
        await h.lifecycle.sweep_controls.resume(await h.sweep(sweep))
        await eventually(lambda: h.runtime.of(held_cell.id)[0].number == 2, "it again")
        h.runtime.of(held_cell.id)[0].exit(0)
        await in_phase(h, sweep, SweepPhase.SUCCEEDED)

    run(tmp_path, body)


@pytest.mark.parametrize("cells", [1, 2])
def test_a_sweep_whose_cells_were_all_cancelled_while_it_waited_ends_when_it_begins(
        tmp_path: Path, cells: int) -> None:
    """Its cells cancelled while it waited for a job (`after`): once the job ends the
    sweep begins with nothing to release, and ends. It had stayed Running for good (one
    cell: no look at its begin), or Pending (two: no cell left to be its canary)."""
    async def body(h: LifecycleHarness) -> None:
        first = await h.create_job("first")
        sweep = await h.create_sweep("after-first", grid={"X": list(range(cells))},
                                     template={"command": ["train"],
                                               "after": ["afterok:first"]})
        for cell in await h.cells(sweep):
            await h.lifecycle.jobs.control(cell, "cancel")
        (rank,) = await h.launched(first.id)
        rank.exit(0)
        ended = await in_phase(h, sweep, SweepPhase.FAILED)
        assert ended.reason == Reason.CELLS_FAILED
        assert ended.message == f"{cells} of {cells} cells did not succeed"

    run(tmp_path, body)


def test_a_canary_that_passes_while_its_sweep_is_resumed_opens_the_gate(
        tmp_path: Path) -> None:
    """The smoke canary succeeds after its sweep's suspend, before that suspend's stop
    reached it; its end's commit waits (another connection holds the write lock), and
    the resume, which finds the canary still gating, asks for Canary after it. The end
    lands first and the gate, finding the sweep still Suspended, leaves the pass to the
    resume, which lands in Canary with no canary left: it opens the gate itself (the
    sweep had stayed in Canary for good, every cell held)."""
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("resumed", grid={"X": [1, 2]}, canary_smoke="true")
        smoke = sweep.spec.smoke_job
        assert smoke is not None
        (canary,) = await h.launched(smoke)
        owner_controls = h.lifecycle.controls
        stop_job = owner_controls.suspend

        async def not_yet(job: JobRecord) -> None:  # the suspend's stop, still on its way
            if job.id != smoke:
                await stop_job(job)

        owner_controls.suspend = not_yet  # type: ignore[method-assign]
        await h.lifecycle.sweep_controls.suspend(sweep)
        owner_controls.suspend = stop_job  # type: ignore[method-assign]
        store = h.store
        blocker = sqlite3.connect(store.path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        writes, stop_counting = count_writes(store)
        canary.exit(0)
        await eventually(lambda: len(writes) == 1, "the canary's end asked for")
        resume = asyncio.ensure_future(h.lifecycle.sweep_controls.resume(
            await h.sweep(sweep)))
        await eventually(lambda: len(writes) == 2, "the resume's commit asked for")
        stop_counting()
        blocker.execute("COMMIT")
        blocker.close()
        await resume
        assert (await h.job(smoke)).phase == Phase.SUCCEEDED
        for cell in await h.cells(sweep):
            (rank,) = await h.launched(cell.id)
            rank.exit(0)
        await in_phase(h, sweep, SweepPhase.SUCCEEDED)

    run(tmp_path, body)


def test_a_smoke_canary_that_passes_before_its_sweep_knows_it_is_in_canary_opens_the_gate(
        tmp_path: Path) -> None:
    """The smoke canary is queued as its sweep begins, and may run and pass before the
    begin's own commit (Pending -> Canary) is answered: the gate's pass, made from
    Pending, is then not applied. It is made again from Canary (the sweep had stayed in
    Canary for good, every cell held)."""
    async def body(h: LifecycleHarness) -> None:
        store = h.store
        write = store.write
        answer = asyncio.Event()
        # The sweep's insert, the begin's move to Canary (answered late), the gate's pass.
        slow: list[object] = []

        def late_begin(op: Any, *args: Any, **kwargs: Any) -> Any:
            done = write(op, *args, **kwargs)
            if kwargs.get("quick"):
                return done
            slow.append(op)
            if len(slow) != 2:
                return done

            async def later() -> Any:
                value = await done
                await answer.wait()
                return value

            return asyncio.ensure_future(later())

        store.write = late_begin  # type: ignore[method-assign]
        created = asyncio.ensure_future(h.create_sweep("early", grid={"X": [1, 2]},
                                                       canary_smoke="true"))
        await eventually(lambda: h.runtime.ranks, "the smoke canary launched")
        smoke = h.runtime.ranks[0]
        smoke.exit(0)
        await eventually(lambda: h.phase_of(smoke.job_id, Phase.SUCCEEDED),
                         "the smoke canary passed")
        await eventually(lambda: len(slow) >= 3, "the gate's pass asked for")
        answer.set()
        store.write = write  # type: ignore[method-assign]
        sweep = await created
        for cell in await h.cells(sweep):
            (rank,) = await h.launched(cell.id)
            rank.exit(0)
        await in_phase(h, sweep, SweepPhase.SUCCEEDED)

    run(tmp_path, body)


def test_cells_are_released_within_a_max_cost_by_the_budget_look(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        sweep = await h.create_sweep("budget", grid={"X": [1, 2, 3, 4]}, canary="none",
                                     max_parallel=2, max_cost=1.0)
        cells = await h.cells(sweep)
        active = h.lifecycle.sweeps.active(sweep.id)
        assert active is not None
        first, second = [(await h.launched(cell.id))[0] for cell in cells[:2]]
        await eventually(lambda: active.budget is BudgetLook.IDLE, "the look to end")
        assert launched_cells(h, cells) == [0, 1]  # nothing spent yet: max_parallel
        # Under a max_cost a cell's room is handed on once its cost is committed.
        first.exit(0)
        third = (await h.launched(cells[2].id))[0]
        second.exit(0)
        fourth = (await h.launched(cells[3].id))[0]
        third.exit(0)
        fourth.exit(0)
        await in_phase(h, sweep, SweepPhase.SUCCEEDED)
        assert active.budget is BudgetLook.IDLE

    run(tmp_path, body)


def test_each_look_names_every_state_and_refuses_the_moves_it_does_not_allow() -> None:
    settle = {(a, b) for a, targets in SETTLE_TRANSITIONS.items() for b in targets}
    assert set(SETTLE_TRANSITIONS) == set(SettleLook)
    assert settle == {(SettleLook.IDLE, SettleLook.LOOKING),
                      (SettleLook.LOOKING, SettleLook.AGAIN),
                      (SettleLook.LOOKING, SettleLook.IDLE),
                      (SettleLook.LOOKING, SettleLook.ENDING),
                      (SettleLook.AGAIN, SettleLook.LOOKING),
                      (SettleLook.AGAIN, SettleLook.ENDING),
                      (SettleLook.ENDING, SettleLook.IDLE)}
    for current, target in itertools.product(SettleLook, SettleLook):
        if (current, target) not in settle:
            with pytest.raises(IllegalTransition):
                check_settle_transition(current, target)
    budget = {(a, b) for a, targets in BUDGET_TRANSITIONS.items() for b in targets}
    assert set(BUDGET_TRANSITIONS) == set(BudgetLook)
    assert budget == {(BudgetLook.IDLE, BudgetLook.LOOKING),
                      (BudgetLook.LOOKING, BudgetLook.AGAIN),
                      (BudgetLook.LOOKING, BudgetLook.IDLE),
                      (BudgetLook.AGAIN, BudgetLook.LOOKING),
                      (BudgetLook.AGAIN, BudgetLook.IDLE)}
    for current, target in itertools.product(BudgetLook, BudgetLook):
        if (current, target) not in budget:
            with pytest.raises(IllegalTransition):
                check_budget_transition(current, target)


def test_each_cell_is_stored_as_the_plan_s_cell_with_the_resolved_after(
        tmp_path: Path) -> None:
    """A cell's row holds its plan's spec with `after` as the sweep resolved it (ids, not
    names), built from the wire form rather than a second copy of the spec: the same
    JSON, key for key, as the copy gave."""
    import json
    from dataclasses import replace

    from noduslocal.domain.sweep_plan import parse_sweep

    async def body(h: LifecycleHarness) -> None:
        first = await h.create_job("first")
        fields = {"grid": {"X": ["a", "b", "c"]},
                  "template": {"command": ["train"], "after": ["afterany:first"],
                               "env": {"K": "v"}}}
        sweep = await h.create_sweep("resolved", **fields)
        plan = parse_sweep({"name": "resolved", **fields}, regions=h.settings.region_names)
        after = sweep.spec.template.after
        assert [(dep.name, dep.id, dep.condition) for dep in after] == [
            ("first", first.id, "afterany")]
        with sqlite3.connect(h.settings.data_dir / "noduslocal.db") as conn:
            rows = conn.execute("SELECT cell, spec FROM jobs WHERE sweep_id = ? "
                                "ORDER BY cell", (sweep.id,)).fetchall()
        assert [cell for cell, _ in rows] == [0, 1, 2]
        for cell, spec in rows:
            expected = replace(plan.cell_spec(cell, "resolved"), after=after).to_wire()
            assert spec == json.dumps(expected)

    run(tmp_path, body)
