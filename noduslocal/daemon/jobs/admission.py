"""Admission: a new job is checked against what this box and the user's limits can ever
give, stored with its event in one transaction (idempotently, under a free name), and
queued.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.jobs.background import Background
from noduslocal.daemon.jobs.dispatch import Dispatch
from noduslocal.daemon.scheduler.capacity import Capacity, Request
from noduslocal.daemon.store import Store, job_writes
from noduslocal.domain import errors
from noduslocal.domain.jobs import CreateRequest, JobRecord

NAME_TRIES = 5  # generated names that may clash before create gives up
T = TypeVar("T")


async def under_a_free_name(store: Store, requested: str | None, kind: str,
                            insert: Callable[[sqlite3.Connection, str, float], Any]) -> T:
    """Store with `insert(conn, name, now)` under the requested name, or under a generated
    `<kind>-<8 hex>` tried again while it clashes; a requested name that clashes raises."""
    for _ in range(NAME_TRIES):
        name = requested or f"{kind}-{secrets.token_hex(4)}"
        now = time.time()
        try:
            created: T = await store.write(lambda c, n=name, t=now: insert(c, n, t))
            return created
        except errors.AlreadyExists:
            if requested:
                raise
    raise errors.Internal(f"could not generate a free {kind} name")


class Admission:
    def __init__(self, live: LiveSettings, store: Store, capacity: Capacity,
                 dispatch: Dispatch, background: Background) -> None:
        self.live = live
        self.store = store
        self.capacity = capacity
        self.dispatch = dispatch
        self.background = background

    def check(self, req: CreateRequest, owner: job_writes.Owner) -> None:
        """Refuse what can never run here, naming the field and what is allowed."""
        if self.background.closed:
            raise errors.Conflict("the daemon is shutting down; submit again once it is back")
        if req.spec.priority > self.live.current.max_user_priority and not owner.admin:
            raise errors.InvalidArgument(
                f"priority: at most {self.live.current.max_user_priority} for users; admins may "
                "go higher", field="priority")
        if req.spec.region is not None:
            return  # the cluster's own limits apply there (sbatch says what it refuses)
        request = Request.of(0, req.spec, owner.uid)
        limit = self.live.current.user_max_gpus
        if limit is not None and request.gpu_count > limit:
            raise errors.InvalidArgument(f"gpu: {request.gpu_count} GPUs requested; a user may "
                                         f"hold at most {limit} at once here", field="gpu")
        if (why := self.capacity.refusal(request) or self.capacity.disk_refusal(request)):
            raise errors.InvalidArgument(why, field=why.split(":")[0])

    async def create(self, req: CreateRequest, owner: job_writes.Owner, idempotency_key: str | None,
                     request_hash: str | None) -> tuple[JobRecord, bool]:
        self.check(req, owner)
        project = req.project or owner.name
        created: job_writes.Created = await under_a_free_name(
            self.store, req.name, "job", lambda c, name, now: job_writes.insert_job(
                c, req, owner, name, project, now, idempotency_key, request_hash))
        if created.created:
            self.dispatch.enqueue(created.job)
        return created.job, created.created
