"""The API's one door to sweeps, built as the job service is: find one (never another
owner's by accident), list, create, the owners' controls, wait, the status document and
its cells, `sweep gc` and `sweep rm`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from noduslocal.daemon.disk.room import Room
from noduslocal.daemon.disk.usage import DiskUsage
from noduslocal.daemon.events import EventHub, sweep_topic
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.jobs.service import found
from noduslocal.daemon.store import Store
from noduslocal.daemon.store import sweeps as sweep_writes
from noduslocal.daemon.sweeps.admission import SweepAdmission
from noduslocal.daemon.sweeps.controller import SweepController
from noduslocal.daemon.sweeps.controls import SweepControls
from noduslocal.daemon.sweeps.reports import SweepReports
from noduslocal.daemon.sweeps.webhooks import Webhooks
from noduslocal.domain import errors
from noduslocal.domain.jobs import Owner
from noduslocal.domain.states import SWEEP_TERMINAL, TERMINAL
from noduslocal.domain.sweep_plan import Plan
from noduslocal.domain.sweeps import SweepRecord

SweepAction = Literal["cancel", "cancel-remaining", "suspend", "resume", "retry", "retry-all"]


class SweepService:
    def __init__(self, store: Store, hub: EventHub, layout: JobLayout, room: Room,
                 usage: DiskUsage, webhooks: Webhooks, admission: SweepAdmission,
                 controller: SweepController, controls: SweepControls,
                 reports: SweepReports) -> None:
        """`hub`: where the controller tells of each transition (`wait` waits there)."""
        self.store = store
        self.hub = hub
        self.layout = layout
        self.room = room
        self.usage = usage
        self.webhooks = webhooks
        self.admission = admission
        self.controller = controller
        self.controls = controls
        self.reports = reports

    # --- finding and listing --------------------------------------------------------------

    async def find(self, project: str, name: str, caller_uid: int, implicit: bool
                   ) -> SweepRecord:
        """The sweep NAME in PROJECT. `implicit`: the caller did not name the project (their
        own was taken), so a sweep there of another owner is not theirs to find."""
        return found("sweep", await self.store.sweep(project, name), project, name,
                     caller_uid, implicit)

    async def fresh(self, sweep: SweepRecord) -> SweepRecord:
        found = await self.store.sweep(sweep.project, sweep.name)
        if found is None or found.id != sweep.id:  # `sweep rm` meanwhile (its row stays)
            raise errors.NotFound(f"sweep {sweep.name!r} was removed")
        return found

    async def list(self, *, project: str | None, active_only: bool, limit: int,
                   before: int | None) -> list[SweepRecord]:
        return await self.store.sweeps(project=project, active_only=active_only, limit=limit,
                                       before=before)

    async def document(self, sweep: SweepRecord, redact: bool) -> dict[str, Any]:
        """The sweep's status: phase, counts, cost, the best cell, failures clustered by
        error, the estimate. `redact`: for a caller who is not the owner."""
        return await self.reports.status(sweep, redact)

    async def documents(self, sweeps: list[SweepRecord], redact: list[bool]
                        ) -> list[dict[str, Any]]:
        """A page of sweeps' statuses, each as document() makes it, from a fixed number of
        queries whatever the page's size, and no file read. `redact`: each sweep's."""
        return await self.reports.statuses(sweeps, redact)

    async def cells(self, sweep: SweepRecord, offset: int, limit: int,
                    redact: bool) -> list[dict[str, Any]]:
        return await self.reports.cells(sweep, offset, limit, redact)

    # --- what owners do -------------------------------------------------------------------

    async def create(self, plan: Plan, owner: Owner, idempotency_key: str | None,
                     request_hash: str | None) -> tuple[SweepRecord, bool]:
        await self.webhooks.check(plan.webhook)
        await self.room.require_unless_made("new sweeps", owner.uid, owner.name, "sweeps",
                                            idempotency_key)
        sweep, created = await self.admission.create(plan, owner, idempotency_key,
                                                     request_hash)
        return await self.fresh(sweep), created

    async def control(self, sweep: SweepRecord, action: SweepAction) -> SweepRecord:
        """Cancel (every cell, or only those not started), suspend, resume, or retry the
        failed cells (or the cancelled ones too); the sweep after."""
        if action in ("cancel", "cancel-remaining"):
            await self.controls.cancel(sweep, action == "cancel-remaining")
        elif action == "suspend":
            await self.controls.suspend(sweep)
        elif action == "resume":
            await self.controls.resume(sweep)
        else:
            self.room.require("new jobs", sweep.owner_uid, sweep.owner)
            await self.controls.retry(sweep, action == "retry-all")
        return await self.fresh(sweep)

    async def set_max_parallel(self, sweep: SweepRecord, max_parallel: int) -> SweepRecord:
        await self.controls.set_max_parallel(sweep, max_parallel)
        return await self.fresh(sweep)

    async def free(self, sweep: SweepRecord) -> SweepRecord:
        """`sweep gc`: free the workspaces of every job a finished sweep made; their
        history, logs and cost stay."""
        if sweep.phase not in SWEEP_TERMINAL:
            raise errors.Conflict(f"sweep {sweep.name!r} is {sweep.phase}; gc frees a "
                                  "finished sweep only (cancel it first)")
        made = await self.store.sweep_made(sweep.id)
        if live := [job.name for job in made if job.phase not in TERMINAL]:
            raise errors.Conflict(f"sweep {sweep.name!r}: {len(live)} of its jobs have not "
                                  f"ended ({live[0]} first); gc once they have")
        await asyncio.to_thread(lambda: [self.layout.free(job.id) for job in made])
        await self.store.write(lambda c: sweep_writes.mark_freed(c, sweep.id, time.time()))
        self.usage.refresh_soon()
        return await self.fresh(sweep)

    async def remove(self, sweep: SweepRecord, by: str) -> None:
        """`sweep rm`: an ended sweep out of listings, its name (and its cells' names) free
        for a new sweep, every job it made removed as `job rm` removes one; their attempts
        and cost stay."""
        if sweep.phase not in SWEEP_TERMINAL:
            raise errors.Conflict(f"sweep {sweep.name!r} is {sweep.phase}; cancel it first "
                                  "(`sweep cancel`), or `map --replace`")
        active = self.controls.controls.board.active
        if ending := [job.name for job in await self.store.sweep_made(sweep.id)
                      if job.id in active]:
            raise errors.Conflict(f"sweep {sweep.name!r}: {ending[0]} is still ending; "
                                  "remove the sweep once it has")
        removed = await self.store.write(
            lambda c: sweep_writes.remove_sweep(c, sweep.id, time.time(), by))
        await asyncio.to_thread(lambda: [self.layout.remove(job_id) for job_id in removed])
        self.usage.refresh_soon()

    async def wait(self, sweep: SweepRecord, timeout: float) -> SweepRecord:
        """The sweep once it has ended, or as it is after `timeout` seconds."""
        if sweep.phase in SWEEP_TERMINAL:
            return sweep
        return await self.hub.long_poll(sweep_topic(sweep.id), lambda: self.fresh(sweep),
                                        lambda now: now.phase in SWEEP_TERMINAL, timeout)
