"""Running sweeps: the canary (cell 0) runs alone and gates the rest, cells are released
into the queue in order up to max_parallel, each cell's end is learnt from committed
events, and the sweep ends Succeeded, Failed (CellsFailed or CanaryFailed) or Cancelled.
Which cells are held back lives here only, so a restart recomputes it from the store.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable

from noduslocal.daemon.events import EventHub, sweep_topic
from noduslocal.daemon.jobs.background import Background
from noduslocal.daemon.jobs.dispatch import Dispatch
from noduslocal.daemon.store import Store
from noduslocal.daemon.store import sweeps as sweep_ops
from noduslocal.daemon.sweeps.state import (
    ActiveSweep,
    BudgetLook,
    HeldCells,
    SettleLook,
    affordable,
    held_because,
)
from noduslocal.daemon.sweeps.webhooks import Webhooks
from noduslocal.domain.jobs import Event, JobRecord
from noduslocal.domain.states import SWEEP_TERMINAL, TERMINAL, Phase, Reason, SweepPhase
from noduslocal.domain.sweeps import SweepRecord

log = logging.getLogger(__name__)
ACTIVE = frozenset({Phase.PENDING, Phase.STARTING, Phase.RUNNING})
RELEASING = frozenset({SweepPhase.PENDING, SweepPhase.CANARY, SweepPhase.RUNNING})  # not held
# Held cells read (and their directories made) ahead at once, at least, for a sweep
# without code: a read and a trip to the directories' thread per released cell cost a
# short task more than the task (issue 25, part 5); the next read is asked for once half of
# them are left, so it lands before they run out. A sweep with code reads max_parallel
# ahead, again once fewer are left: each cell made ahead holds an overlay mount until it
# starts.
READ_AHEAD = 32
ARM_AHEAD = 4  # a running sweep's next cells launched ahead, held until each starts


class SweepController:
    def __init__(self, store: Store, dispatch: Dispatch, background: Background,
                 webhooks: Webhooks, hub: EventHub, running_cost: Callable[[int], float],
                 prepare_ahead: Callable[[list[JobRecord]], None] = lambda jobs: None,
                 arm_ahead: Callable[[list[JobRecord]], None] = lambda jobs: None,
                 ) -> None:
        """`hub`: told of each transition (a sweep's long polls wait there);
        `running_cost(job_id)`: what a running cell has cost so far; `prepare_ahead`: the
        next cells, read ahead, may have their directories made meanwhile; `arm_ahead`:
        the next few may be launched ahead, held until their start (runner.arm_ahead)."""
        self._prepare_ahead = prepare_ahead
        self._arm_ahead = arm_ahead
        self.store = store
        self.dispatch = dispatch
        self.background = background
        self.webhooks = webhooks
        self.hub = hub
        self._running_cost = running_cost
        self._sweeps: dict[int, ActiveSweep] = {}
        self._cell_of: dict[int, int] = {}  # job id -> sweep id, cells of active sweeps

    # --- starting ---------------------------------------------------------------------

    async def add(self, sweep: SweepRecord, job_ids: list[int]) -> None:
        """A sweep just created: its cells (in cell order) are all held."""
        active = ActiveSweep(sweep, HeldCells(job_ids))
        self.track(active, job_ids)
        await self._begin(active)

    @staticmethod
    def smoke(sweep: SweepRecord) -> int | None:
        """The smoke canary's job, when a smoke command gates the sweep."""
        return sweep.spec.smoke_job

    async def recover(self) -> None:
        """After a restart: every unended sweep's cells that never started are held again,
        those that run count against max_parallel, and a canary that ended meanwhile
        decides the gate now."""
        for sweep in await self.store.sweeps(active_only=True, limit=-1):
            cells = await self.store.sweep_cells(sweep.id)
            active = ActiveSweep(sweep, HeldCells(j for j, _, p in cells if p == Phase.PENDING),
                                 {j for j, _, p in cells if p in ACTIVE and p != Phase.PENDING})
            self.track(active, [j for j, _, p in cells if p not in TERMINAL])
            if sweep.phase == SweepPhase.PENDING:
                await self._begin(active)
                continue
            if sweep.phase == SweepPhase.SUSPENDED:
                await self._recover_suspended(active, cells)
                continue
            if sweep.phase == SweepPhase.CANARY:
                job_id, _, phase = cells[0]
                if (smoke := self.smoke(sweep)) is not None:
                    job_id, phase = smoke, (await self.store.jobs_by_ids([smoke]))[0].phase
                    self.track(active, [smoke])
                    if phase == Phase.PENDING:
                        active.canary = smoke
                        self.spawn_enqueue(active, [smoke])
                if phase in TERMINAL:
                    await self.gate(active, job_id, phase)
                    continue
                active.canary = job_id
            self.release(active)
            self.settle_if_done(active)

    async def _recover_suspended(self, active: ActiveSweep,
                                 cells: list[tuple[int, int, str]]) -> None:
        """A suspended sweep stays so: what runs is being stopped, and the canary it had
        when suspended still gates it once resumed (unless it ended meanwhile)."""
        sweep = active.record
        active.stopping = set(active.running)
        if await self.store.sweep_phase_before_suspend(sweep.id) != SweepPhase.CANARY:
            return
        job_id, _, phase = cells[0]
        if (smoke := self.smoke(sweep)) is not None:
            job_id, phase = smoke, (await self.store.jobs_by_ids([smoke]))[0].phase
            self.track(active, [smoke])
        if phase in TERMINAL:
            await self.gate(active, job_id, phase)
        else:
            active.canary = job_id

    def spawn_enqueue(self, active: ActiveSweep, ids: list[int]) -> None:
        """enqueue() on its own task."""
        self.background.spawn(self.enqueue(active, ids))

    def active(self, sweep_id: int) -> ActiveSweep | None:
        """What is known of an unended sweep."""
        return self._sweeps.get(sweep_id)

    def track(self, active: ActiveSweep, job_ids: list[int]) -> None:
        self._sweeps[active.record.id] = active
        for job_id in job_ids:
            self._cell_of[job_id] = active.record.id

    async def _begin(self, active: ActiveSweep) -> None:
        """A Pending sweep begins: at once, or once what it waits for (`after`) is met."""
        if after := active.record.spec.template.after:
            self.dispatch.gate.hold_sweep(
                active.record.id, after, lambda: self.background.spawn(self._start(active)),
                lambda message: self._never_satisfied(active, message))
            return
        await self._start(active)

    async def _never_satisfied(self, active: ActiveSweep, message: str) -> None:
        """What the sweep waited for can no longer be met: it ends Cancelled, its cells
        (and smoke canary) with it, in one transaction."""
        smoke = self.smoke(active.record)
        await self.end_with_waiting(active, SweepPhase.CANCELLED,
                                    Reason.DEPENDENCY_NEVER_SATISFIED, lambda _: message,
                                    f"its sweep's dependency: {message}",
                                    lambda: [smoke] if smoke is not None else [])

    def waits(self, sweep_id: int) -> bool:
        """Whether the sweep waits for its dependencies (nothing of it released yet)."""
        return self.dispatch.gate.sweep_wait_reason(sweep_id) is not None

    async def _start(self, active: ActiveSweep) -> None:
        if active.record.phase != SweepPhase.PENDING:
            return  # cancelled while it waited
        smoke = self.smoke(active.record)
        # The first cell not cancelled while the sweep waited (`after`) is its canary.
        gated = smoke is not None or (active.record.spec.canary == "cell"
                                      and active.record.cells > 1 and len(active.held) > 0)
        if smoke is not None:
            active.canary = smoke
            self.track(active, [smoke])
            self.spawn_enqueue(active, [smoke])
        elif gated:
            active.canary = active.held[0]
        await self.transition(active, SweepPhase.CANARY if gated else SweepPhase.RUNNING,
                               Reason.SCHEDULED)
        self.release(active)
        self.settle_if_done(active)  # every cell cancelled while it waited: it ends

    # --- cells in, cells out ----------------------------------------------------------

    def release(self, active: ActiveSweep) -> None:
        phase = active.record.phase
        if phase == SweepPhase.CANARY:
            room = 1 if active.canary in active.held else 0
        elif phase == SweepPhase.RUNNING:
            room = active.record.max_parallel - len(active.running)
            if active.record.spec.max_cost is not None and active.held:
                if active.budget is BudgetLook.IDLE:
                    active.budget_to(BudgetLook.LOOKING)
                    self.background.spawn(self._release_within_budget(active))
                elif active.budget is BudgetLook.LOOKING:
                    active.budget_to(BudgetLook.AGAIN)  # the look under way goes once more
                return
        else:
            return
        ids = [active.held.popleft() for _ in range(min(room, len(active.held)))]
        if not ids:
            return
        active.running.update(ids)
        # Cells read ahead go to the queue now, so their start joins the commit that frees
        # their room; the others are read first.
        unread = []
        for job_id in ids:
            job = active.ready.pop(job_id, None)
            if job is None:
                unread.append(job_id)
            else:
                self.dispatch.enqueue(job)
        active.releasing.update(unread)
        reach = self._reach(active)
        # Those being read count as read: a second look asked for meanwhile read the same
        # cells again (1,598 rows for a 1,000-cell map).
        if unread or (len(active.ready) + len(active.reading)
                      < max(active.record.max_parallel, reach // 2)):
            self.spawn_enqueue(active, unread)

    @staticmethod
    def _reach(active: ActiveSweep) -> int:
        """How many held cells are read ahead (see READ_AHEAD)."""
        if active.record.spec.template.source:
            return active.record.max_parallel
        return max(active.record.max_parallel, READ_AHEAD)

    async def enqueue(self, active: ActiveSweep, ids: list[int]) -> None:
        """Queue the released cells `ids`, and read the next held ones ahead."""
        ahead = [j for j in itertools.islice(active.held, self._reach(active))
                 if j not in active.ready and j not in active.reading]
        if not ids and not ahead:
            return  # all read, or being read, already
        prepare = []
        active.reading.update(ahead)
        try:
            jobs = await self.store.jobs_by_ids([*ids, *ahead])
        finally:
            active.reading.difference_update(ahead)
        for job in jobs:
            if job.id not in ids:
                if job.phase == Phase.PENDING and job.id in active.held:
                    active.ready[job.id] = job
                    prepare.append(job)
            # Withdrawn meanwhile (a cancel of that cell, or of the sweep, or a suspend of
            # the sweep) is not queued.
            elif (job.phase == Phase.PENDING and active.record.phase in RELEASING
                  and ((job.id in active.releasing and job.id in active.running)
                       or job.id == active.canary)):
                self.dispatch.enqueue(job)
        active.releasing.difference_update(ids)
        if prepare:
            self._prepare_ahead(prepare)
            self._arm_next(active)

    def cell_launched(self, job_id: int) -> None:
        """A cell was launched: its sweep's next cells may be armed. Not when its room was
        handed on: the arming's work on the loop would come before that launch."""
        active = self._sweeps.get(self._cell_of.get(job_id, -1))
        if active is not None:
            self._arm_next(active)

    def _arm_next(self, active: ActiveSweep) -> None:
        """The cells released next, read ahead already, launched ahead where the runtime
        can hold them: as many as may run at once, ARM_AHEAD at most. A cell that does
        not start soon (the queue favours another user) is let go by the runtime."""
        if active.record.phase != SweepPhase.RUNNING:
            return  # a canary's cells wait for it, perhaps long
        reach = min(ARM_AHEAD, active.record.max_parallel)
        jobs = [job for job_id in itertools.islice(active.held, reach)
                if (job := active.ready.get(job_id)) is not None]
        if jobs:
            self._arm_ahead(jobs)

    def cell_ending(self, job_id: int, phase: str) -> None:
        """A cell's end is about to be committed (the runner says so before the commit):
        its room goes to the next cell at once, whose start then joins that commit. The
        committed event does the rest (the canary's gate, the sweep's own end)."""
        active = self._sweeps.get(self._cell_of.get(job_id, -1))
        # Not under a max_cost: the budget counts a cell's cost once its end is committed.
        if (active is not None and phase in TERMINAL and job_id in active.running
                and job_id != active.canary and active.record.spec.max_cost is None):
            active.running.discard(job_id)
            self.release(active)

    async def _release_within_budget(self, active: ActiveSweep) -> None:
        """Release cells while what is spent, what the running cells will cost (each at
        least a typical cell's cost) and the next cell's estimate stay within max_cost;
        when nothing runs and the next cell would pass it, the rest never start."""
        limit = active.record.spec.max_cost
        assert limit is not None  # only a sweep with a budget is released this way
        try:
            while active.record.phase == SweepPhase.RUNNING and active.held:
                if active.budget is BudgetLook.AGAIN:  # a round begins: changes from now
                    active.budget_to(BudgetLook.LOOKING)  # on ask for another
                spent, typical = await self.store.sweep_costs(active.record.id)
                count = affordable(spent, [self._running_cost(j) for j in active.running],
                                   typical, limit,
                                   active.record.max_parallel - len(active.running),
                                   len(active.held))
                ids = [active.held.popleft() for _ in range(count)]
                if ids:
                    active.running.update(ids)
                    active.releasing.update(ids)
                    self.spawn_enqueue(active, ids)
                elif not active.running and active.held:
                    await self._over_budget(active, spent, limit)
                if active.budget is BudgetLook.LOOKING:  # nothing changed meanwhile
                    return
        finally:
            active.budget_to(BudgetLook.IDLE)

    async def _over_budget(self, active: ActiveSweep, spent: float, limit: float) -> None:
        why = f"the sweep's max_cost of {limit:g} would be passed (spent {spent:.4g})"
        await self.end_with_waiting(active, SweepPhase.FAILED, Reason.MAX_COST_EXCEEDED,
                                    lambda cells: f"{why}; {len(cells)} cells not started",
                                    why)

    async def end_with_waiting(self, active: ActiveSweep, phase: SweepPhase, reason: str,
                               message: Callable[[list[int]], str], cells_message: str,
                               also: Callable[[], list[int]] = lambda: []) -> bool:
        """End the sweep `phase`, every cell that waits (and `also()`'s) cancelled with
        `reason` in the same transaction. The waiting cells leave the sweep's books
        first, so none of them starts meanwhile. Another transition committed before
        this one (the canary's pass, a suspend) leaves the sweep unended: the cells go
        back to the books and the end is asked for again from the phase it is in now.
        That one ended it: the cells this took are cancelled on their own, so none is
        left Pending in no one's books. False: the sweep ended otherwise."""
        while True:
            taken, suspended = await self._take_waiting(active)
            extra = also()
            cells = [*taken, *suspended, *extra]
            if await self.transition(active, phase, reason, message(cells),
                                     cancel=(cells, reason, cells_message)):
                return True
            if active.record.phase in SWEEP_TERMINAL:
                stranded, now = [*taken, *extra], time.time()
                if stranded:
                    await self.store.write(lambda c, cells=stranded, at=now: (
                        None, sweep_ops.cancel_cells(c, cells, at, reason, cells_message)[1]))
                return False
            for job_id in taken:  # held again: never started (in `running` no more)
                active.held.insert(job_id)

    async def _take_waiting(self, active: ActiveSweep) -> tuple[list[int], list[int]]:
        """The held cells and the released ones not queued yet, taken out of the books;
        and the suspended ones (in no books: their resume puts them back)."""
        cells = await self.store.sweep_cells(active.record.id)
        taken = [*active.held, *active.releasing]
        active.held.clear()
        active.running.difference_update(active.releasing)
        active.releasing.clear()
        return taken, [j for j, _, phase in cells if phase == Phase.SUSPENDED]

    def withdraw(self, job_id: int) -> bool:
        """Take a held cell back (an owner cancels or suspends it); False when the cell is
        not held here (it was released, or is no cell)."""
        active = self._sweeps.get(self._cell_of.get(job_id, -1))
        if active is None:
            return False
        if job_id in active.releasing:  # released, not queued yet: it never started
            active.releasing.discard(job_id)
            active.running.discard(job_id)
            return True
        if job_id not in active.held:
            return False
        active.held.remove(job_id)
        active.ready.pop(job_id, None)
        return True

    def return_to_unreleased(self, job: JobRecord) -> bool:
        """A suspended cell of a running sweep, resumed: back among the sweep's unreleased
        (held) cells in its order, so the canary gate and max_parallel still apply; False
        when the job is no such cell (the caller queues it)."""
        active = self._sweeps.get(self._cell_of.get(job.id, -1))
        if active is None:
            return False
        active.held.insert(job.id)
        self.release(active)
        return True

    def on_events(self, events: list[Event]) -> None:
        """Committed job events: a cell that ended, was suspended or resumed."""
        touched: dict[int, ActiveSweep] = {}
        for event in events:
            sweep_id = self._cell_of.get(event.job_id)
            active = self._sweeps.get(sweep_id) if sweep_id is not None else None
            if active is None:
                continue
            if event.phase in TERMINAL or event.phase == Phase.SUSPENDED:
                active.running.discard(event.job_id)
                if (event.job_id in active.stopping and event.phase == Phase.SUSPENDED
                        and active.record.phase != SweepPhase.SUSPENDED):
                    # Stopped by a suspend of the sweep, which was resumed meanwhile.
                    self.background.spawn(self.resume_late(active, event.job_id))
                active.stopping.discard(event.job_id)
                if event.phase in TERMINAL:
                    del self._cell_of[event.job_id]
                if event.job_id == active.canary and event.phase in TERMINAL:
                    self.background.spawn(self.gate(active, event.job_id, event.phase))
                    continue
            touched[active.record.id] = active
        for active in touched.values():
            self.release(active)
            self.settle_if_done(active)

    async def resume_late(self, active: ActiveSweep, job_id: int) -> None:
        """A cell whose stop the sweep's suspend asked for, suspended after the sweep was
        resumed: it goes back with the others."""
        if not await self.store.write(lambda c: sweep_ops.resume_jobs(c, [job_id],
                                                                       time.time())):
            return  # cancelled, or resumed by its owner, meanwhile
        if job_id == self.smoke(active.record):
            self.spawn_enqueue(active, [job_id])
        else:
            active.held.insert(job_id)
        self.release(active)

    async def gate(self, active: ActiveSweep, job_id: int, phase: str) -> None:
        """The canary ended: open the gate, or fail the sweep and cancel the rest. While
        the sweep is suspended a pass only opens the gate for its resume."""
        active.canary = None
        which = ("the smoke canary" if job_id == self.smoke(active.record)
                 else "the canary (cell 0)")
        if phase == Phase.SUCCEEDED and active.record.phase == SweepPhase.SUSPENDED:
            return
        if phase == Phase.SUCCEEDED:
            # Made again when another move was committed first, from where the sweep is
            # now (its begin's Canary, answered after a smoke canary that passed at once);
            # not once it is suspended (its resume passes the gate) or ended.
            while active.record.phase in (SweepPhase.PENDING, SweepPhase.CANARY):
                if await self.transition(active, SweepPhase.RUNNING, Reason.CANARY_PASSED,
                                         f"{which} succeeded"):
                    break
            self.release(active)
            self.settle_if_done(active)
            return
        canary = (await self.store.jobs_by_ids([job_id]))[0]
        why = f"{which} ended {phase}: {canary.message or canary.reason}"
        await self.end_with_waiting(active, SweepPhase.FAILED, Reason.CANARY_FAILED,
                                    lambda _: f"{why}; nothing else ran", why)

    def settle_if_done(self, active: ActiveSweep) -> None:
        if (not active.held and not active.running
                and active.record.phase in (SweepPhase.CANARY, SweepPhase.RUNNING)):
            if active.settle is SettleLook.IDLE:
                active.settle_to(SettleLook.LOOKING)
                self.background.spawn(self._settle(active))
            elif active.settle is SettleLook.LOOKING:
                active.settle_to(SettleLook.AGAIN)  # an end committed during the look
            # Again: it reads once more already; Ending: the sweep's end is on its way.

    async def _settle(self, active: ActiveSweep) -> None:
        while True:
            if active.settle is SettleLook.AGAIN:  # a round begins: ends committed from
                active.settle_to(SettleLook.LOOKING)  # now on ask for another
            counts, _ = await self.store.sweep_totals(active.record.id)
            if not any(n and phase not in TERMINAL for phase, n in counts.items()):
                break
            if active.settle is SettleLook.LOOKING:  # a cell is suspended, or its end not
                active.settle_to(SettleLook.IDLE)  # committed: the next end or resume looks
                return
        active.settle_to(SettleLook.ENDING)
        failed = counts.get(Phase.FAILED, 0) + counts.get(Phase.CANCELLED, 0)
        ended = False
        if active.record.phase not in (SweepPhase.CANARY, SweepPhase.RUNNING):
            pass  # suspended during the look: not ended while it is
        elif failed:
            ended = await self.transition(
                active, SweepPhase.FAILED, Reason.CELLS_FAILED,
                f"{failed} of {active.record.cells} cells did not succeed")
        else:
            ended = await self.transition(active, SweepPhase.SUCCEEDED, Reason.COMPLETED,
                                          f"all {active.record.cells} cells succeeded")
        if not ended and active.record.phase not in SWEEP_TERMINAL:
            # Suspended during the look, or another move of the sweep (a suspend) was
            # committed before its end: the end is worked out again when it goes on (the
            # resume looks), or now if it still runs.
            active.settle_to(SettleLook.IDLE)
            self.settle_if_done(active)

    # --- reading ------------------------------------------------------------------------

    def wait_reason(self, job_id: int) -> str | None:
        """Why a held cell waits, in words."""
        active = self._sweeps.get(self._cell_of.get(job_id, -1))
        if active is None or job_id not in active.held:
            return None
        if (after := self.dispatch.gate.sweep_wait_reason(active.record.id)) is not None:
            return f"sweep {active.record.name}: {after}"
        return held_because(active, self.smoke(active.record) is not None)

    def describe(self) -> list[str]:
        """Each active sweep's cells as this controller holds them, a line each (the
        daemon's state dump, main.py's SIGUSR1)."""
        def few(ids: Iterable[int]) -> str:
            ids = list(ids)
            return f"{ids[:8]}{'+' + str(len(ids) - 8) if len(ids) > 8 else ''}"
        return [f"sweep {a.record.id} {a.record.name} {a.record.phase}: canary {a.canary}, "
                f"held {few(a.held)}, ready {few(a.ready)}, reading {few(sorted(a.reading))}, "
                f"running {few(sorted(a.running))}, "
                f"releasing {few(sorted(a.releasing))}, stopping {few(sorted(a.stopping))}, "
                f"settle {a.settle.name}, budget {a.budget.name}"
                for a in self._sweeps.values()]

    def is_cell(self, job_id: int) -> bool:
        """A cell of a sweep that runs (released or held)."""
        return job_id in self._cell_of

    async def transition(self, active: ActiveSweep, phase: SweepPhase, reason: str,
                         message: str | None = None,
                         cancel: tuple[list[int], str, str] | None = None,
                         resume: list[int] | None = None) -> bool:
        """The sweep's transition; with `cancel` (cells, reason, message) those cells are
        cancelled, with `resume` those suspended jobs are Pending again, in the same
        transaction, so a crash leaves both or neither. False: another came first."""
        sweep = active.record
        was = SweepPhase(sweep.phase)
        if was in SWEEP_TERMINAL:  # ended meanwhile (a smoke canary's failure): settled
            return False
        now = time.time()
        applied = await self.store.write(lambda c: sweep_ops.move_sweep(
            c, sweep.id, phase, now, reason, message, was, cancel, resume))
        if not applied:  # another transition came first (a cancel during the last end)
            return False
        sweep.phase, sweep.reason, sweep.message = phase.value, reason, message
        sweep.ended_at = now if phase in SWEEP_TERMINAL else None  # as the row has it
        log.info("sweep %s: %s (%s)", sweep.name, phase.value, message or reason)
        hooks = {Reason.CANARY_PASSED: ["canary-passed"],
                 Reason.CANARY_FAILED: ["canary-failed"]}.get(reason, [])
        self.webhooks.send(sweep, *hooks, *(["completed"] if phase in SWEEP_TERMINAL else []))
        if phase in SWEEP_TERMINAL:
            self.dispatch.gate.sweep_ended(sweep.id)  # jobs `after` it are judged again
            # Out of the books, unless they hold the sweep anew: its owner's retry, acted
            # on between this commit and its answer (a busy loop), tracks the retried
            # cells under the same id, and taking them out left the sweep Running for good.
            if self._sweeps.get(sweep.id) is active:
                del self._sweeps[sweep.id]
                for job_id in [j for j, s in self._cell_of.items() if s == sweep.id]:
                    del self._cell_of[job_id]
        self.notify(sweep.id)
        return True

    def notify(self, sweep_id: int) -> None:
        """The sweep's row changed (committed): its long polls look again."""
        self.hub.changed(sweep_topic(sweep_id))
