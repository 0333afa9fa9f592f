"""The dependency gate: a pending job with `after` waits here, out of the queue (it holds
no place there and starves nobody), until every job or sweep it names has ended as its
condition asks (then it is queued), or one has ended otherwise (then it ends Cancelled,
DependencyNeverSatisfied). A sweep with `after` waits here the same way before its first
cell is released. Nothing is kept here only: the specs hold the ids, so a restarted
daemon's recovery hands its pending jobs and sweeps back and they are judged anew.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from noduslocal.daemon.jobs.background import Background
from noduslocal.daemon.store import Store, job_writes
from noduslocal.domain.dependencies import Dependency, needs, verdict
from noduslocal.domain.jobs import Event, JobRecord
from noduslocal.domain.states import TERMINAL

log = logging.getLogger(__name__)
Key = tuple[bool, int]  # (a sweep, its id): what waits, or what it waits for


def _key(dep: Dependency) -> Key:
    assert dep.id is not None  # resolved when the job was stored
    return dep.sweep, dep.id


@dataclass
class Waiter:
    """What waits, and what becomes of it: `met()` once every dependency is met,
    `never(message)` once one can no longer be."""

    after: list[Dependency]
    met: Callable[[], None]
    never: Callable[[str], Awaitable[None]]
    why: str


class DependencyGate:
    def __init__(self, store: Store, background: Background,
                 release: Callable[[JobRecord], None]) -> None:
        """`release(job)`: queue a job whose dependencies are all met."""
        self.store = store
        self.background = background
        self._release = release
        self.waiting: dict[int, JobRecord] = {}  # jobs, by id
        self._waiters: dict[Key, Waiter] = {}
        self._dependents: dict[Key, set[Key]] = {}

    def hold(self, job: JobRecord) -> bool:
        """Keep JOB here while its dependencies are not known to be met; False when it has
        none (the caller queues it). It is judged at once, on a task of its own."""
        if not job.spec.after:
            return False

        async def never(message: str) -> None:
            if await self.store.write(lambda c: job_writes.never_satisfied(
                    c, job.id, time.time(), message)):
                log.info("job %s: %s", job.name, message)

        self._wait((False, job.id), job.spec.after, lambda: self._release(job), never)
        self.waiting[job.id] = job
        return True

    def hold_sweep(self, sweep_id: int, after: list[Dependency], met: Callable[[], None],
                   never: Callable[[str], Awaitable[None]]) -> None:
        """A sweep that waits, before any cell is released, as a job does."""
        self._wait((True, sweep_id), after, met, never)

    def _wait(self, key: Key, after: list[Dependency], met: Callable[[], None],
              never: Callable[[str], Awaitable[None]]) -> None:
        self._forget(key)
        first = after[0]
        self._waiters[key] = Waiter(after, met, never,
                                    f"waiting for {first.label} ({first.condition})")
        for dep in after:
            self._dependents.setdefault(_key(dep), set()).add(key)
        self.background.spawn(self._judge([key]))

    def remove(self, job_id: int) -> bool:
        """Take a waiting job back (its owner cancels or suspends it); False when it does
        not wait here."""
        if self.waiting.pop(job_id, None) is None:
            return False
        self._forget((False, job_id))
        return True

    def remove_sweep(self, sweep_id: int) -> None:
        """The sweep no longer waits (it was cancelled, or has ended)."""
        self._forget((True, sweep_id))

    def _forget(self, key: Key) -> None:
        waiter = self._waiters.pop(key, None)
        if waiter is None:
            return
        if not key[0]:
            self.waiting.pop(key[1], None)
        for dep in waiter.after:
            if (keys := self._dependents.get(_key(dep))) is not None:
                keys.discard(key)
                if not keys:
                    del self._dependents[_key(dep)]

    def wait_reason(self, job_id: int) -> str | None:
        waiter = self._waiters.get((False, job_id))
        return None if waiter is None else waiter.why

    def sweep_wait_reason(self, sweep_id: int) -> str | None:
        waiter = self._waiters.get((True, sweep_id))
        return None if waiter is None else waiter.why

    def on_events(self, events: list[Event]) -> None:
        """Committed job events: what waits for a job that ended is judged again."""
        keys = {k for e in events if e.phase in TERMINAL
                for k in self._dependents.get((False, e.job_id), ())}
        if keys:
            self.background.spawn(self._judge(sorted(keys)))

    def sweep_ended(self, sweep_id: int) -> None:
        """A sweep's end is committed: what waits for it is judged again."""
        self.remove_sweep(sweep_id)
        if keys := self._dependents.get((True, sweep_id)):
            self.background.spawn(self._judge(sorted(keys)))

    async def _judge(self, keys: list[Key]) -> None:
        waiters = [(k, self._waiters[k]) for k in keys if k in self._waiters]
        if not waiters:
            return
        deps = [dep for _, waiter in waiters for dep in waiter.after]
        job_phases, sweep_phases = await self.store.phases(
            sorted({d.id for d in deps if not d.sweep and d.id is not None}),
            sorted({d.id for d in deps if d.sweep and d.id is not None}))
        for key, waiter in waiters:
            if self._waiters.get(key) is not waiter:
                continue  # taken back (or judged and handed on) meanwhile
            unmet: Dependency | None = None
            for dep in waiter.after:
                phase = (sweep_phases if dep.sweep else job_phases).get(dep.id or -1)
                met = False if phase is None else verdict(dep, phase)
                if met is False:
                    self._forget(key)
                    ended = phase or "gone (it no longer exists)"
                    await waiter.never(f"{dep.label} ended {ended}; {dep.condition} needed "
                                       f"it {needs(dep)}")
                    break
                if met is None and unmet is None:
                    unmet = dep
            else:
                if unmet is None:
                    self._forget(key)
                    waiter.met()
                else:
                    waiter.why = f"waiting for {unmet.label} ({unmet.condition})"
