"""The dependency gate: a pending job with `after` waits here, out of the queue (it holds
no place there and starves nobody), until every job or sweep it names has ended as its
condition asks (then it is queued), or one has ended otherwise (then it ends Cancelled,
DependencyNeverSatisfied). Nothing is kept here only: the spec holds the ids, so a
restarted daemon's recovery queues its pending jobs again and they are judged anew.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from noduslocal.daemon.jobs.background import Background
from noduslocal.daemon.store import Store, job_writes
from noduslocal.domain.dependencies import Dependency, needs, verdict
from noduslocal.domain.jobs import Event, JobRecord
from noduslocal.domain.states import TERMINAL

log = logging.getLogger(__name__)
Key = tuple[bool, int]  # (a sweep, its id)


def _key(dep: Dependency) -> Key:
    assert dep.id is not None  # resolved when the job was stored
    return dep.sweep, dep.id


class DependencyGate:
    def __init__(self, store: Store, background: Background,
                 release: Callable[[JobRecord], None]) -> None:
        """`release(job)`: queue a job whose dependencies are all met."""
        self.store = store
        self.background = background
        self._release = release
        self.waiting: dict[int, JobRecord] = {}
        self._why: dict[int, str] = {}
        self._dependents: dict[Key, set[int]] = {}

    def hold(self, job: JobRecord) -> bool:
        """Keep JOB here while its dependencies are not known to be met; False when it has
        none (the caller queues it). It is judged at once, on a task of its own."""
        if not job.spec.after:
            return False
        self.waiting[job.id] = job
        first = job.spec.after[0]
        self._why.setdefault(job.id, f"waiting for {first.label} ({first.condition})")
        for dep in job.spec.after:
            self._dependents.setdefault(_key(dep), set()).add(job.id)
        self.background.spawn(self._judge([job.id]))
        return True

    def remove(self, job_id: int) -> bool:
        """Take a waiting job back (its owner cancels or suspends it); False when it does
        not wait here."""
        job = self.waiting.pop(job_id, None)
        if job is None:
            return False
        self._why.pop(job_id, None)
        for dep in job.spec.after:
            if (ids := self._dependents.get(_key(dep))) is not None:
                ids.discard(job_id)
                if not ids:
                    del self._dependents[_key(dep)]
        return True

    def wait_reason(self, job_id: int) -> str | None:
        return self._why.get(job_id) if job_id in self.waiting else None

    def on_events(self, events: list[Event]) -> None:
        """Committed job events: the jobs waiting for one that ended are judged again."""
        ids = {i for e in events if e.phase in TERMINAL
               for i in self._dependents.get((False, e.job_id), ())}
        if ids:
            self.background.spawn(self._judge(sorted(ids)))

    def sweep_ended(self, sweep_id: int) -> None:
        """A sweep's end is committed: the jobs waiting for it are judged again."""
        if ids := self._dependents.get((True, sweep_id)):
            self.background.spawn(self._judge(sorted(ids)))

    async def _judge(self, ids: list[int]) -> None:
        jobs = [self.waiting[i] for i in ids if i in self.waiting]
        if not jobs:
            return
        deps = [dep for job in jobs for dep in job.spec.after]
        job_phases, sweep_phases = await self.store.phases(
            sorted({d.id for d in deps if not d.sweep and d.id is not None}),
            sorted({d.id for d in deps if d.sweep and d.id is not None}))
        for job in jobs:
            if self.waiting.get(job.id) is not job:
                continue  # taken back (or judged and queued again) meanwhile
            unmet: Dependency | None = None
            for dep in job.spec.after:
                phase = (sweep_phases if dep.sweep else job_phases).get(dep.id or -1)
                met = False if phase is None else verdict(dep, phase)
                phase = phase or "gone (it no longer exists)"  # for the message
                if met is False:
                    self.remove(job.id)
                    await self._never(job, dep, phase)
                    break
                if met is None and unmet is None:
                    unmet = dep
            else:
                if unmet is None:
                    self.remove(job.id)
                    self._release(job)
                else:
                    self._why[job.id] = f"waiting for {unmet.label} ({unmet.condition})"

    async def _never(self, job: JobRecord, dep: Dependency, phase: str) -> None:
        message = (f"{dep.label} ended {phase}; {dep.condition} needed it {needs(dep)}")
        ended = await self.store.write(lambda c: job_writes.never_satisfied(
            c, job.id, time.time(), message))
        if ended:
            log.info("job %s: %s", job.name, message)
