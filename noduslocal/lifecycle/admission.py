"""Admission: a new job is checked against what this box and the user's limits can ever
give, stored with its event in one transaction (idempotently, under a free name), and
queued.
"""

from __future__ import annotations

import secrets
import time

from noduslocal import errors
from noduslocal.config import Settings
from noduslocal.lifecycle.background import Background
from noduslocal.lifecycle.dispatch import Dispatch
from noduslocal.models import CreateRequest, JobRecord
from noduslocal.scheduler.capacity import Capacity, Request
from noduslocal.store import Store, ops

NAME_TRIES = 5  # generated names that may clash before create gives up


class Admission:
    def __init__(self, settings: Settings, store: Store, capacity: Capacity,
                 dispatch: Dispatch, background: Background) -> None:
        self.settings = settings
        self.store = store
        self.capacity = capacity
        self.dispatch = dispatch
        self.background = background

    def check(self, req: CreateRequest, owner: ops.Owner) -> None:
        """Refuse what can never run here, naming the field and what is allowed."""
        if self.background.closed:
            raise errors.Conflict("the daemon is shutting down; submit again once it is back")
        if req.spec.priority > self.settings.max_user_priority and not owner.admin:
            raise errors.InvalidArgument(
                f"priority: at most {self.settings.max_user_priority} for users; admins may "
                "go higher", field="priority")
        request = Request.of(0, req.spec, owner.uid)
        limit = self.settings.user_max_gpus
        if limit is not None and request.gpu_count > limit:
            raise errors.InvalidArgument(f"gpu: {request.gpu_count} GPUs requested; a user may "
                                         f"hold at most {limit} at once here", field="gpu")
        if (why := self.capacity.refusal(request)) is not None:
            raise errors.InvalidArgument(why, field=why.split(":")[0])

    async def create(self, req: CreateRequest, owner: ops.Owner, idempotency_key: str | None,
                     request_hash: str | None) -> tuple[JobRecord, bool]:
        self.check(req, owner)
        project = req.project or owner.name
        for _ in range(NAME_TRIES):
            name = req.name or f"job-{secrets.token_hex(4)}"
            now = time.time()
            try:
                created: ops.Created = await self.store.write(
                    lambda c, n=name, t=now: ops.insert_job(
                        c, req, owner, n, project, t, idempotency_key, request_hash))
                break
            except errors.AlreadyExists:
                if req.name:
                    raise
        else:
            raise errors.Internal("could not generate a free job name")
        if created.created:
            self.dispatch.enqueue(created.job)
        return created.job, created.created
