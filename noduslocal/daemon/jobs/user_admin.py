"""What an admin does to people's work: hold and release a user's queue (their pending jobs
start no more; what runs goes on), change a job's priority, and the report of every user's
use against their limits. Holds are kept in the database, so they outlive a restart.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.jobs.accounting import GpuAccounting
from noduslocal.daemon.jobs.dispatch import Dispatch
from noduslocal.daemon.scheduler.queue import Queue
from noduslocal.daemon.store import Store, reports, resources
from noduslocal.domain import errors
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.states import TERMINAL

log = logging.getLogger("noduslocald")


def hold_reason(by: str, reason: str | None) -> str:
    return f"your queue is held by admin {by}" + (f": {reason}" if reason else "")


class UserAdmin:
    def __init__(self, live: LiveSettings, store: Store, queue: Queue,
                 accounting: GpuAccounting, dispatch: Dispatch) -> None:
        self.live = live
        self.store = store
        self.queue = queue
        self.accounting = accounting
        self.dispatch = dispatch

    async def recover(self) -> None:
        """The holds in force when the daemon stopped, before any job may start."""
        for uid, (by, _, reason) in (await reports.user_holds(self.store)).items():
            self.queue.held_users[uid] = hold_reason(by, reason)

    async def hold_user(self, uid: int, name: str, by: str, reason: str | None) -> None:
        await self.store.write(lambda c: resources.set_user_hold(
            c, uid, True, by, time.time(), reason))
        self.queue.held_users[uid] = hold_reason(by, reason)
        log.info("queue held by %s%s", by, f": {reason}" if reason else "",
                 extra={"user": name})
        self.dispatch.kick()

    async def release_user(self, uid: int, name: str, by: str) -> None:
        await self.store.write(lambda c: resources.set_user_hold(c, uid, False, by,
                                                                 time.time(), None))
        self.queue.held_users.pop(uid, None)
        log.info("queue released by %s", by, extra={"user": name})
        self.dispatch.kick()

    async def set_priority(self, job: JobRecord, priority: int, by: str) -> None:
        """The job's priority from now on: its place in the queue, and whether a waiting
        job may preempt it. Stored in its spec, so a restart keeps it."""
        if job.phase in TERMINAL:
            raise errors.Conflict(f"job {job.name!r} has ended ({job.phase}); its priority "
                                  "no longer matters")
        await self.store.write(lambda c: resources.set_priority(c, job.id, priority))
        if (req := self.queue.request(job.id)) is not None:
            self.queue.replace(replace(req, priority=priority))
        self.dispatch.lanes.reprioritize(job.id, priority)  # one bound for a cluster
        capacity = self.queue.capacity
        if job.id in capacity.running:
            req, until = capacity.running[job.id]
            capacity.running[job.id] = (replace(req, priority=priority), until)
        log.info("priority %d -> %d by %s", job.spec.priority, priority, by,
                 extra={"job": f"{job.project}/{job.name}"})
        self.dispatch.kick()

    async def report(self, only: tuple[int, str] | None = None) -> list[dict[str, Any]]:
        """Each user who has work here or a hold: what they run, hold and wait for, their
        fair-share use, and the limits that apply to them. ONLY (uid, name): that user's
        row alone, with or without work here."""
        names = await reports.owner_names(self.store)
        holds = await reports.user_holds(self.store)
        pending: dict[int, int] = {}
        for req in self.queue.last_order():
            pending[req.owner_uid] = pending.get(req.owner_uid, 0) + 1
        by_user = self.queue.capacity.by_user
        uids = sorted({*names, *holds, *pending, *by_user})
        if only is not None:
            uids = [only[0]]
            names.setdefault(only[0], only[1])
        settings = self.live.current
        out = []
        for uid in uids:
            jobs, gpus = by_user.get(uid, (0, 0))
            hold = holds.get(uid)
            out.append({
                "uid": uid, "name": names.get(uid, str(uid)),
                "running_jobs": jobs, "gpus_held": gpus, "pending_jobs": pending.get(uid, 0),
                "gpu_hours": round(self.accounting.usage(uid), 4),
                "limits": {"max_gpus": settings.user_max_gpus,
                           "max_jobs": settings.user_max_jobs,
                           "max_execs": settings.user_max_execs,
                           "max_connections": settings.user_max_connections,
                           "max_priority": settings.max_user_priority},
                "held": None if hold is None else {"by": hold[0], "at": hold[1],
                                                   "reason": hold[2]},
            })
        return out
