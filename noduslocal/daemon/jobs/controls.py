"""What owners ask of a job once it exists: cancel, suspend (stop it and keep it aside),
resume (queue it again at its old place), whichever phase it is in when they ask, and
remove an ended one (its name free again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.jobs.attempt import Board
from noduslocal.daemon.jobs.dispatch import Dispatch
from noduslocal.daemon.jobs.stops import Stopper
from noduslocal.daemon.store import Store, job_writes
from noduslocal.domain import errors
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.states import TERMINAL, Phase, Reason


class OwnerControls:
    def __init__(self, store: Store, layout: JobLayout, dispatch: Dispatch, board: Board,
                 stopper: Stopper, withdraw: Callable[[int], bool],
                 return_to_unreleased: Callable[[JobRecord], bool]) -> None:
        """`withdraw(job_id)`: takes back a sweep's cell that was never queued; False when
        the job is not such a cell. `return_to_unreleased(job)`: a resumed cell goes back
        among its sweep's unreleased cells; False when it is no cell of a running sweep."""
        self.store = store
        self.layout = layout
        self.dispatch = dispatch
        self.board = board
        self.stopper = stopper
        self._withdraw = withdraw
        self._return_to_unreleased = return_to_unreleased

    def _take_back(self, job_id: int) -> bool:
        """Out of the queue, or out of its sweep's held cells: it never started."""
        return self.dispatch.remove(job_id) or self._withdraw(job_id)

    async def cancel(self, job: JobRecord) -> None:
        if job.phase == Phase.CANCELLED:
            return
        if job.phase in TERMINAL:
            raise errors.Conflict(f"job {job.name!r} has already ended ({job.phase})")
        if self._take_back(job.id):
            await self.store.write(lambda c: job_writes.cancel_pending(
                c, job.id, time.time(), "cancelled before it started"))
            self.dispatch.kick()
            return
        attempt = self.board.active.get(job.id)
        if attempt is not None:
            await self.stopper.request_stop(attempt, Reason.CANCELLED)
            return
        if (recorded := self.board.finishing.get(job.id)) is not None:
            # Its end is being recorded right now; if that end leaves it suspended or
            # queued again, the cancel applies to what it became. Its processes are gone:
            # while a full disk holds the end back, the caller is answered meanwhile.
            await self.stopper.settle(self.stopper.aside(self._cancel_after(job.id,
                                                                            recorded)))
            return
        if job.phase == Phase.SUSPENDED:
            await self.store.write(lambda c: job_writes.set_phase(
                c, job.id, Phase.CANCELLED, time.time(), Reason.CANCELLED,
                "cancelled while suspended", expect=Phase.SUSPENDED))
            return
        raise errors.Conflict(f"job {job.name!r} is {job.phase} and cannot be cancelled now")

    async def _cancel_after(self, job_id: int, recorded: asyncio.Future[None]) -> None:
        await asyncio.shield(recorded)
        fresh = await self.store.job_by_id(job_id)
        if fresh is not None and fresh.phase not in TERMINAL:
            await self.cancel(fresh)

    async def suspend(self, job: JobRecord) -> None:
        """Stop the job as a cancel would, and keep it aside until resume()."""
        if job.phase == Phase.SUSPENDED:
            return
        if job.phase in TERMINAL:
            raise errors.Conflict(f"job {job.name!r} has already ended ({job.phase})")
        if self._take_back(job.id):
            await self.store.write(lambda c: job_writes.set_phase(
                c, job.id, Phase.SUSPENDED, time.time(), Reason.SUSPENDED,
                "suspended before it started; `job resume` queues it again"))
            self.dispatch.kick()
            return
        attempt = self.board.active.get(job.id)
        if attempt is None:
            raise errors.Conflict(f"job {job.name!r} is {job.phase} and cannot be suspended "
                                  "now")
        await self.stopper.request_stop(attempt, Reason.SUSPENDED)

    async def remove(self, job: JobRecord, by: str) -> None:
        """An ended job out of listings, its name free, its directory gone; its attempts
        stay (fair share, cost history)."""
        if job.sweep_id is not None:
            raise errors.Conflict(f"job {job.name!r} is a cell of a sweep; `sweep gc` frees "
                                  "a sweep's cells")
        if job.phase not in TERMINAL or job.id in self.board.active:
            raise errors.Conflict(f"job {job.name!r} is {job.phase}; cancel it first "
                                  "(`job kill`), or `job run --replace`")
        await self.store.write(lambda c: job_writes.remove_job(c, job.id, time.time(), by))
        await asyncio.to_thread(self.layout.remove, job.id)

    async def resume(self, job: JobRecord) -> None:
        if job.phase != Phase.SUSPENDED:
            raise errors.Conflict(f"job {job.name!r} is {job.phase}; only a suspended job "
                                  "can be resumed")
        await self.store.write(lambda c: job_writes.set_phase(
            c, job.id, Phase.PENDING, time.time(), Reason.RESUMED,
            "resumed; queued again at its old place", expect=Phase.SUSPENDED))
        resumed = replace(job, phase=Phase.PENDING.value, reason=Reason.RESUMED)
        if not self._return_to_unreleased(resumed):
            self.dispatch.enqueue(resumed)
