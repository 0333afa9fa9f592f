"""Stopping a running attempt for a reason (cancel, timeout, suspend, preemption, cost):
the reason made durable first, then SIGTERM, then SIGKILL after the grace; for a container
that dockerd cannot be reached for, the stop stays due until it can.
"""

from __future__ import annotations

import asyncio
import signal
from typing import TYPE_CHECKING

from noduslocal.outcomes import Attempt, overrides
from noduslocal.store import ops

if TYPE_CHECKING:
    from noduslocal.config import Settings
    from noduslocal.store import Store


class Stops:
    settings: Settings
    store: Store
    active: dict[int, Attempt]
    _stopping: bool

    if TYPE_CHECKING:  # provided by the Supervisor (stubs here would shadow it)
        async def _signal(self, attempt: Attempt, sig: int) -> bool: ...

    async def _request_stop(self, attempt: Attempt, reason: str) -> None:
        if attempt.stop_reason is not None and not overrides(reason, attempt.stop_reason):
            return
        resend = attempt.stop_reason is not None  # e.g. a cancel over a suspend: stopping
        attempt.stop_reason = reason
        if resend:
            if not attempt.number and attempt.started is not None:
                attempt.number = await attempt.started
            await self.store.write(lambda c: ops.request_stop(
                c, attempt.job.id, attempt.number, reason))
            return
        if attempt.running:
            attempt.stop_sent = False  # until the signal lands; an exit before it is the job's
        if not attempt.number and attempt.started is not None:
            # Acknowledged only once it is durable: wait for the start commit so the stop
            # can be recorded on the attempt (_run_attempt then ends it unstarted).
            attempt.number = await attempt.started
        # Persisted so a restarted daemon reads the exit the same way.
        await self.store.write(lambda c: ops.request_stop(
            c, attempt.job.id, attempt.number, reason))
        if self.active.get(attempt.job.id) is attempt and attempt.running:
            await self._send_stop(attempt)

    async def _send_stop(self, attempt: Attempt) -> None:
        delivered = await self._signal(attempt, signal.SIGTERM)
        if not delivered and attempt.job.spec.image is not None and attempt.retry_stop is None:
            # dockerd away, or the container not adopted yet: the stop stays due.
            attempt.retry_stop = asyncio.create_task(self._retry_stop(attempt))
        if delivered:
            attempt.stop_sent = True  # no await since the kill: the exit cannot be seen yet
        if delivered and self.active.get(attempt.job.id) is attempt:
            attempt.timers.append(asyncio.get_running_loop().call_later(
                self.settings.kill_grace, lambda: asyncio.ensure_future(
                    self._signal(attempt, signal.SIGKILL))))

    async def _retry_stop(self, attempt: Attempt) -> None:
        while (self.active.get(attempt.job.id) is attempt and not self._stopping
               and not (attempt.ended is not None and attempt.ended.done())):
            await asyncio.sleep(1)
            if await self._signal(attempt, signal.SIGTERM):
                attempt.stop_sent = True
                attempt.timers.append(asyncio.get_running_loop().call_later(
                    self.settings.kill_grace, lambda: asyncio.ensure_future(
                        self._signal(attempt, signal.SIGKILL))))
                return
