"""What owners ask of a job once it exists: cancel, suspend (stop it and keep it aside)
and resume (queue it again at its old place), whichever phase it is in when they ask.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from noduslocal import errors
from noduslocal.models import JobRecord
from noduslocal.outcomes import Attempt
from noduslocal.states import TERMINAL, Phase, Reason
from noduslocal.store import ops

if TYPE_CHECKING:
    from noduslocal.scheduler.queue import Queue
    from noduslocal.store import Store


class JobControls:
    store: Store
    queue: Queue
    active: dict[int, Attempt]
    _pending_jobs: dict[int, JobRecord]
    _finishing: set[int]
    _cancel_after: set[int]

    if TYPE_CHECKING:  # provided by the Supervisor (stubs here would shadow it)
        def _kick(self) -> None: ...
        def _enqueue(self, job: JobRecord) -> None: ...
        async def _request_stop(self, attempt: Attempt, reason: str) -> None: ...

    async def cancel(self, job: JobRecord) -> None:
        if job.phase == Phase.CANCELLED:
            return
        if job.phase in TERMINAL:
            raise errors.Conflict(f"job {job.name!r} has already ended ({job.phase})")
        if self.queue.remove(job.id) is not None:
            self._pending_jobs.pop(job.id, None)
            await self.store.write(lambda c: ops.cancel_pending(
                c, job.id, time.time(), "cancelled before it started"))
            self._kick()
            return
        attempt = self.active.get(job.id)
        if attempt is not None:
            await self._request_stop(attempt, Reason.CANCELLED)
            return
        if job.id in self._finishing:
            # Its end is being recorded right now; if that end leaves it suspended or
            # queued again, the cancel is applied once it is committed.
            self._cancel_after.add(job.id)
            return
        if job.phase == Phase.SUSPENDED:
            await self.store.write(lambda c: ops.set_phase(
                c, job.id, Phase.CANCELLED, time.time(), Reason.CANCELLED,
                "cancelled while suspended", expect=Phase.SUSPENDED))
            return
        raise errors.Conflict(f"job {job.name!r} is {job.phase} and cannot be cancelled now")

    async def suspend(self, job: JobRecord) -> None:
        """Stop the job as a cancel would, and keep it aside until resume()."""
        if job.phase == Phase.SUSPENDED:
            return
        if job.phase in TERMINAL:
            raise errors.Conflict(f"job {job.name!r} has already ended ({job.phase})")
        if self.queue.remove(job.id) is not None:
            self._pending_jobs.pop(job.id, None)
            await self.store.write(lambda c: ops.set_phase(
                c, job.id, Phase.SUSPENDED, time.time(), Reason.SUSPENDED,
                "suspended before it started; `job resume` queues it again"))
            self._kick()
            return
        attempt = self.active.get(job.id)
        if attempt is None:
            raise errors.Conflict(f"job {job.name!r} is {job.phase} and cannot be suspended "
                                  "now")
        await self._request_stop(attempt, Reason.SUSPENDED)

    async def resume(self, job: JobRecord) -> None:
        if job.phase != Phase.SUSPENDED:
            raise errors.Conflict(f"job {job.name!r} is {job.phase}; only a suspended job "
                                  "can be resumed")
        await self.store.write(lambda c: ops.set_phase(
            c, job.id, Phase.PENDING, time.time(), Reason.RESUMED,
            "resumed; queued again at its old place", expect=Phase.SUSPENDED))
        self._enqueue(replace(job, phase=Phase.PENDING.value, reason=Reason.RESUMED))
