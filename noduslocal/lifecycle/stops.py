"""Stopping a running attempt for a reason (cancel, timeout, suspend, preemption, cost):
the reason made durable first, then SIGTERM to every rank, then SIGKILL after the grace; a
stop its runtime cannot deliver yet (dockerd away, not adopted yet) stays due until the
attempt ends.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping

from noduslocal.config import Settings
from noduslocal.lifecycle.attempt import Attempt, Board
from noduslocal.lifecycle.background import Background
from noduslocal.lifecycle.outcomes import overrides
from noduslocal.runtime.base import Runtime
from noduslocal.store import Store, ops

RETRY_STOP = 1.0  # seconds between tries of a stop that could not be delivered


class Stopper:
    def __init__(self, settings: Settings, store: Store, board: Board,
                 runtimes: Mapping[str, Runtime], background: Background) -> None:
        self.settings = settings
        self.store = store
        self.board = board
        self.runtimes = runtimes
        self.background = background

    async def signal(self, attempt: Attempt, sig: int) -> bool:
        """Signal every rank; False when none could be (not launched or not adopted yet,
        ended, or its runtime unreachable)."""
        if not attempt.handles or attempt.directory is None:
            return False
        runtime = self.runtimes[attempt.job.spec.runtime]
        delivered = False
        for handle in attempt.handles:
            delivered = await runtime.signal(attempt.ref, handle, sig) or delivered
        return delivered

    async def stop_ranks(self, attempt: Attempt) -> None:
        """One rank ended its gang: SIGTERM to the others, SIGKILL after the grace. No stop
        is recorded: the end that came first is the attempt's."""
        if await self.signal(attempt, signal.SIGTERM) and self.board.holds(attempt):
            attempt.timers.append(asyncio.get_running_loop().call_later(
                self.settings.kill_grace, lambda: self.kill(attempt)))

    def kill(self, attempt: Attempt) -> None:
        """SIGKILL now, on its own task (from code that may not wait)."""
        self.background.spawn(self.signal(attempt, signal.SIGKILL))

    def stop_soon(self, attempt: Attempt, reason: str) -> None:
        """request_stop() on its own task: one slow stop never delays its caller."""
        self.background.spawn(self.request_stop(attempt, reason))

    async def request_stop(self, attempt: Attempt, reason: str) -> None:
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
            # can be recorded on the attempt (the runner then ends it unstarted).
            attempt.number = await attempt.started
        # Persisted so a restarted daemon reads the exit the same way.
        await self.store.write(lambda c: ops.request_stop(
            c, attempt.job.id, attempt.number, reason))
        if self.board.holds(attempt) and attempt.running:
            await self.send_stop(attempt)

    async def send_stop(self, attempt: Attempt) -> None:
        if await self.signal(attempt, signal.SIGTERM):
            self._delivered(attempt)
        elif attempt.retry_stop is None:
            attempt.retry_stop = asyncio.create_task(self._retry_stop(attempt))

    def _delivered(self, attempt: Attempt) -> None:
        attempt.stop_sent = True  # no await since the kill: the exit cannot be seen yet
        if self.board.holds(attempt):
            attempt.timers.append(asyncio.get_running_loop().call_later(
                self.settings.kill_grace, lambda: self.kill(attempt)))

    async def _retry_stop(self, attempt: Attempt) -> None:
        while self.board.holds(attempt) and not self.background.closed and not attempt.ended:
            await asyncio.sleep(RETRY_STOP)
            if await self.signal(attempt, signal.SIGTERM):
                self._delivered(attempt)
                return
