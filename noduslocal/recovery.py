"""After a daemon restart: every attempt that may still run takes its share back (CPUs,
memory, the same GPUs) and is adopted if its shim or container lives, or ended as what
it became meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from noduslocal.gpu.cost import Meter
from noduslocal.models import AttemptRecord, JobRecord
from noduslocal.outcomes import Attempt, settled_inspect
from noduslocal.runtime.attempts import Alive, AttemptState, read_pid
from noduslocal.scheduler.queue import Request
from noduslocal.states import AttemptPhase
from noduslocal.store import ops

if TYPE_CHECKING:
    from pathlib import Path

    from noduslocal.gpu.model import Inventory
    from noduslocal.runtime.process import ProcessRuntime
    from noduslocal.scheduler.queue import Queue
    from noduslocal.store import Store

log = logging.getLogger(__name__)


class Recovery:
    store: Store
    queue: Queue
    runtime: ProcessRuntime
    inventory: Inventory
    active: dict[int, Attempt]

    if TYPE_CHECKING:  # provided by the Supervisor (stubs here would shadow it)
        def attempt_dir(self, job_id: int, number: int) -> Path: ...
        async def _finish(self, attempt: Attempt, state: AttemptState,
                          running: asyncio.Future[Any] | None = None) -> None: ...
        async def _watch(self, attempt: Attempt, started_at: float,
                         running: asyncio.Future[Any] | None = None) -> None: ...
        async def _reconcile_container(self, attempt: Attempt,
                                       last: AttemptRecord) -> None: ...

    async def _reconcile(self, job: JobRecord) -> None:
        last: AttemptRecord = (await self.store.attempts(job.id))[-1]
        attempt = Attempt(job, Request.of(job.id, job.spec, job.owner_uid),
                          number=last.number, directory=self.attempt_dir(job.id, last.number),
                          running=last.phase == AttemptPhase.RUNNING,
                          shim_pid=last.shim_pid, boot_id=last.boot_id,
                          stop_reason=last.stop_reason)
        attempt.gpus = last.gpus
        if last.gpus:  # the energy before the restart is not known: time only, from here
            attempt.meter = Meter.start(last.gpus, self.inventory,
                                        last.started_at or last.created_at)
            attempt.meter.energy_start = dict.fromkeys(last.gpus)
        self.active[job.id] = attempt
        self.queue.capacity.take(attempt.request, gpus=last.gpus,
                                 started_at=last.started_at or last.created_at)
        assert attempt.directory is not None
        if job.spec.image is not None:
            # dockerd may be away: the attempt holds its CPUs until it is back and says.
            attempt.task = asyncio.create_task(self._reconcile_container(attempt, last))
            return
        state = await settled_inspect(attempt.directory)
        if isinstance(state, Alive):
            log.info("adopting job %s attempt %d (shim %d)", job.name, last.number,
                     state.shim_pid)
            attempt.shim_pid = state.shim_pid
            attempt.task = asyncio.create_task(self._adopt(attempt, last))
        else:
            attempt.task = asyncio.create_task(self._finish(attempt, state))

    async def _adopt(self, attempt: Attempt, last: AttemptRecord,
                     started_at: float | None = None) -> None:
        """Watch an attempt that runs on after a restart; `started_at`: a container's
        start, as dockerd recorded it."""
        job = attempt.job
        started = last.started_at
        if not attempt.running:  # the daemon died between the launch and its commit
            assert attempt.directory is not None
            pid = read_pid(attempt.directory)
            started = pid["started_at"] if pid else (started_at or time.time())
            attempt.running = True
            if attempt.container_id is None:
                attempt.boot_id = self.runtime.boot_id
            await self.store.write(lambda c: ops.attempt_running(
                c, job.id, attempt.number, started, attempt.shim_pid, attempt.boot_id,
                attempt.container_id))
        assert started is not None
        await self._watch(attempt, started)
