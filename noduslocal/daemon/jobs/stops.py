"""Stopping a running attempt for a reason (cancel, timeout, suspend, preemption, cost, a
full disk): the reason queued for the database, then SIGTERM to every rank at once, SIGKILL
after the grace. The signal never waits for the commit (the job may be filling the
database's disk); the writer's order still commits the reason before the attempt's end. A
stop its runtime cannot deliver yet (dockerd away, not adopted yet) stays due until the
attempt ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Coroutine, Mapping
from typing import Any

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.jobs.attempt import Attempt, Board
from noduslocal.daemon.jobs.background import Background
from noduslocal.daemon.jobs.outcomes import overrides
from noduslocal.daemon.runtime.base import Runtime
from noduslocal.daemon.store import Store, job_writes

log = logging.getLogger(__name__)
RETRY_STOP = 1.0  # seconds between tries of a stop that could not be delivered
# Seconds a caller (`job kill`) waits for its stop's record once the signal is out; a
# record that takes longer (the disk is full) lands later, still before the attempt's end.
RECORD_WAIT = 2.0


class Stopper:
    def __init__(self, live: LiveSettings, store: Store, board: Board,
                 runtimes: Mapping[str, Runtime], background: Background) -> None:
        self.live = live
        self.store = store
        self.board = board
        self.runtimes = runtimes
        self.background = background
        self._pending: set[asyncio.Future[Any]] = set()  # records nobody waits for any more

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
        if await self.signal(attempt, signal.SIGTERM) and self.board.occupies(attempt):
            attempt.timers.append(asyncio.get_running_loop().call_later(
                self.live.current.kill_grace, lambda: self.kill(attempt)))

    def kill(self, attempt: Attempt) -> None:
        """SIGKILL now, on its own task (from code that may not wait)."""
        self.background.spawn(self.signal(attempt, signal.SIGKILL))

    def stop_soon(self, attempt: Attempt, reason: str) -> None:
        """request_stop() on its own task: one slow stop never delays its caller."""
        self.background.spawn(self.request_stop(attempt, reason))

    async def request_stop(self, attempt: Attempt, reason: str) -> None:
        if attempt.stop_reason is not None and not overrides(reason, attempt.stop_reason):
            return
        # A second stop (a cancel over a suspend) only changes the reason: one is under way.
        # A first one of a launched attempt is StopAsked until its signal lands: an exit
        # before that is the job's own.
        first = attempt.ask_stop(reason)
        # Queued before the signal goes (the writer keeps order: the end the signal causes
        # is committed after it), and persisted so a restarted daemon reads the exit the
        # same way. An attempt whose start is not committed yet has nothing to signal: the
        # runner ends it unstarted once it is.
        recorded = self._record(attempt, reason)
        if first and self.board.occupies(attempt) and attempt.launched:
            await self.send_stop(attempt)
        await self.settle(recorded)

    def _record(self, attempt: Attempt, reason: str) -> asyncio.Future[Any]:
        if attempt.number or attempt.started is None:
            number = attempt.number
            return self.store.write(lambda c: job_writes.request_stop(c, attempt.job.id, number,
                                                               reason))

        async def once_started() -> None:
            assert attempt.started is not None
            attempt.number = number = await attempt.started
            await self.store.write(lambda c: job_writes.request_stop(c, attempt.job.id, number,
                                                              reason))

        return self.aside(once_started())

    def aside(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        """Run `coro` on its own (held until it ends); for settle()."""
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def settle(self, recorded: asyncio.Future[Any]) -> None:
        """Wait for a commit the caller's answer reports, while commits go through: at
        most RECORD_WAIT, and not at all while the database's disk is full. One not
        waited for lands later, in order; should it fail, the log says so."""
        if self.store.commits_stalled() is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(recorded), RECORD_WAIT)
                return
        if not recorded.done():
            recorded.add_done_callback(_log_failure)
        elif (exc := recorded.exception()) is not None:
            raise exc

    async def send_stop(self, attempt: Attempt) -> None:
        if await self.signal(attempt, signal.SIGTERM):
            self._delivered(attempt)
        elif attempt.retry_stop is None:
            attempt.retry_stop = asyncio.create_task(self._retry_stop(attempt))

    def _delivered(self, attempt: Attempt) -> None:
        attempt.stop_landed()  # no await since the kill: the exit cannot be seen yet
        if self.board.occupies(attempt):
            attempt.timers.append(asyncio.get_running_loop().call_later(
                self.live.current.kill_grace, lambda: self.kill(attempt)))

    async def _retry_stop(self, attempt: Attempt) -> None:
        while self.board.occupies(attempt) and not self.background.closed and not attempt.ended:
            await asyncio.sleep(RETRY_STOP)
            if await self.signal(attempt, signal.SIGTERM):
                self._delivered(attempt)
                return


def _log_failure(recorded: asyncio.Future[Any]) -> None:
    if not recorded.cancelled() and (exc := recorded.exception()) is not None:
        log.error("recording a stop failed: %s", exc)
