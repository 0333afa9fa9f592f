"""What owners ask of a sweep: cancel it (or only the cells not started), retry a failed
one's cells, change max_parallel, and suspend it (its running cells stopped and kept
aside, nothing new released) and resume it; each is durable before it is acknowledged.
"""

from __future__ import annotations

import contextlib
import logging
import time

from noduslocal.daemon.jobs.dispatch import Dispatch
from noduslocal.daemon.jobs.service import OwnerControls
from noduslocal.daemon.store import Store, job_writes
from noduslocal.daemon.store import sweeps as sweep_ops
from noduslocal.daemon.sweeps.controller import SweepController
from noduslocal.daemon.sweeps.state import ActiveSweep, HeldCells
from noduslocal.domain import errors
from noduslocal.domain.states import SWEEP_TERMINAL, TERMINAL, Phase, Reason, SweepPhase
from noduslocal.domain.sweeps import SweepRecord

log = logging.getLogger(__name__)


class SweepControls:
    def __init__(self, store: Store, sweeps: SweepController, dispatch: Dispatch,
                 controls: OwnerControls) -> None:
        self.store = store
        self.sweeps = sweeps
        self.dispatch = dispatch
        self.controls = controls

    def _active(self, sweep: SweepRecord, doing: str) -> ActiveSweep:
        active = self.sweeps.active(sweep.id)
        if sweep.phase in SWEEP_TERMINAL or active is None:
            raise errors.Conflict(f"sweep {sweep.name!r} has already ended ({sweep.phase}); "
                                  f"it cannot be {doing}")
        return active

    def _smoke_gate(self, active: ActiveSweep) -> int | None:
        """The smoke canary's job while it gates the sweep."""
        smoke = self.sweeps.smoke(active.record)
        return smoke if smoke is not None and active.canary == smoke else None

    def _not_started(self, job_id: int) -> bool:
        """Out of the queue now, or never in it: no attempt of it can start."""
        return self.dispatch.remove(job_id) or job_id not in self.controls.board.active

    async def _stop(self, job_ids: list[int], how: str, sweep: SweepRecord) -> None:
        for job in await self.store.jobs_by_ids(job_ids):
            if job.phase in TERMINAL:
                continue
            try:
                await (self.controls.cancel(job) if how == "cancel"
                       else self.controls.suspend(job))
            except errors.Conflict:  # it ended, or is ending, meanwhile: the rest go on
                log.info("%s of cell %s of sweep %s: it ended meanwhile", how, job.name,
                         sweep.name)

    async def cancel(self, sweep: SweepRecord, remaining_only: bool) -> None:
        """End the sweep Cancelled: cells not started (and a suspended sweep's suspended
        ones) are cancelled in its transaction, running ones too unless `remaining_only`."""
        if sweep.phase == SweepPhase.CANCELLED:
            return
        active = self._active(sweep, "cancelled")
        smoke_started: list[int] = []

        def smoke_waiting() -> list[int]:
            smoke_started.clear()
            if (smoke := self._smoke_gate(active)) is None:
                return []
            if self._not_started(smoke):
                return [smoke]
            smoke_started.append(smoke)
            return []

        message = "cancelled on request" + ("; running cells go on" if remaining_only else "")
        await self.sweeps.end_with_waiting(active, SweepPhase.CANCELLED, Reason.CANCELLED,
                                           lambda _: message, "its sweep was cancelled",
                                           smoke_waiting)
        if not remaining_only:
            await self._stop(sorted(active.running) + smoke_started, "cancel", sweep)

    async def suspend(self, sweep: SweepRecord) -> None:
        """Release nothing more; cells released but not started go back to the held ones,
        running ones are stopped as `job suspend` stops a job (each ends Suspended, its
        checkpoint kept). Asked again, it stops what still runs."""
        if self.sweeps.waits(sweep.id):
            raise errors.Conflict(f"sweep {sweep.name!r} waits for its dependencies (after) "
                                  "and has released nothing to suspend; cancel it instead")
        active = self._active(sweep, "suspended")
        smoke = self._smoke_gate(active)
        # Made again from the phase it is in when another transition came first (the
        # canary's pass); not once it ended meanwhile.
        while active.record.phase not in (SweepPhase.SUSPENDED, *SWEEP_TERMINAL):
            running = len(active.running)
            if await self.sweeps.transition(active, SweepPhase.SUSPENDED, Reason.SUSPENDED,
                                            f"suspended on request ({running} running "
                                            "cells stopped); `sweep resume` goes on"):
                break
        if active.record.phase in SWEEP_TERMINAL:
            raise errors.Conflict(f"sweep {sweep.name!r} ended meanwhile "
                                  f"({active.record.phase}); it cannot be suspended")
        # Never started: back among the held cells, in order, still Pending.
        for job_id in [j for j in active.running
                       if j in active.releasing or self.dispatch.remove(j)]:
            active.running.discard(job_id)
            active.releasing.discard(job_id)
            active.held.insert(job_id)
        stopping = sorted(active.running)
        if smoke is not None and self._not_started(smoke):
            with contextlib.suppress(errors.Conflict):  # it is no longer Pending
                await self.store.write(lambda c: job_writes.set_phase(
                    c, smoke, Phase.SUSPENDED, time.time(), Reason.SUSPENDED,
                    "its sweep was suspended before it started", expect=Phase.PENDING))
        elif smoke is not None:
            stopping.append(smoke)
        active.stopping.update(stopping)
        await self._stop(stopping, "suspend", sweep)

    async def resume(self, sweep: SweepRecord) -> None:
        """Back to the phase it was suspended in (the canary gate still shut if it had not
        passed); its suspended cells are Pending again in the same transaction and wait
        among the held ones, released by the usual rule."""
        if sweep.phase != SweepPhase.SUSPENDED:
            raise errors.Conflict(f"sweep {sweep.name!r} is {sweep.phase}; only a suspended "
                                  "sweep can be resumed")
        active = self._active(sweep, "resumed")
        smoke = self._smoke_gate(active)
        cells = [j for j, _, phase in await self.store.sweep_cells(sweep.id)
                 if phase == Phase.SUSPENDED]
        target = SweepPhase.CANARY if active.canary is not None else SweepPhase.RUNNING
        resume = cells + ([smoke] if smoke is not None else [])
        if not await self.sweeps.transition(active, target, Reason.RESUMED,
                                            f"resumed; {len(cells)} suspended cells wait "
                                            "again", resume=resume):
            raise errors.Conflict(f"sweep {sweep.name!r} changed meanwhile; look again")
        if target == SweepPhase.CANARY and active.canary is None:
            # Its canary passed while this was committed: the gate, finding the sweep
            # still suspended, left the pass to the resume.
            await self.sweeps.transition(active, SweepPhase.RUNNING, Reason.CANARY_PASSED,
                                         "its canary succeeded while it was suspended")
        for job_id in cells:
            active.running.discard(job_id)
            active.held.insert(job_id)
        if smoke is not None:  # Pending again, or never stopped: queued if it waits
            self.sweeps.spawn_enqueue(active, [smoke])
        self.sweeps.release(active)
        self.sweeps.settle_if_done(active)

    async def retry(self, sweep: SweepRecord, include_cancelled: bool) -> None:
        """Run a Failed sweep's failed cells again (the canary first after a canary
        failure), as new jobs held and released by the usual rule."""
        retried: sweep_ops.RetriedCells = await self.store.write(
            lambda c: sweep_ops.retry_cells(c, sweep.id, include_cancelled, time.time()))
        fresh = await self.store.sweep(sweep.project, sweep.name)
        assert fresh is not None
        active = ActiveSweep(fresh, HeldCells(retried.job_ids), canary=retried.canary)
        self.sweeps.track(active, retried.job_ids)
        if retried.canary is not None and retried.canary not in retried.job_ids:
            self.sweeps.track(active, [retried.canary])  # a smoke canary: queued at once
            self.sweeps.spawn_enqueue(active, [retried.canary])
        self.sweeps.notify(fresh.id)
        self.sweeps.release(active)

    async def set_max_parallel(self, sweep: SweepRecord, max_parallel: int) -> None:
        self._active(sweep, "changed")
        await self.store.write(lambda c: sweep_ops.set_max_parallel(c, sweep.id,
                                                                    max_parallel))
        active = self.sweeps.active(sweep.id)
        if active is not None:
            active.record.max_parallel = max_parallel
            self.sweeps.release(active)
