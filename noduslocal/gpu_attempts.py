"""The GPU side of the supervisor: the environment that pins a job to its GPUs, and a
new reading of the GPUs (a foreign process, a lost or broken GPU): what may start changes,
and work on a GPU that broke is ended as lost, to be retried on another.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from noduslocal.gpu.model import Inventory, job_env
from noduslocal.outcomes import Attempt
from noduslocal.states import Reason

if TYPE_CHECKING:
    from noduslocal.config import Settings
    from noduslocal.scheduler.fairshare import Ledger
    from noduslocal.scheduler.queue import Queue, Request

log = logging.getLogger(__name__)


class GpuAttempts:
    inventory: Inventory
    queue: Queue
    active: dict[int, Attempt]
    ledger: Ledger
    settings: Settings

    if TYPE_CHECKING:  # provided by the Supervisor (stubs here would shadow it)
        def _kick(self) -> None: ...
        def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...
        async def _request_stop(self, attempt: Attempt, reason: str) -> None: ...
        async def _signal(self, attempt: Attempt, sig: int) -> bool: ...

    def gpu_env(self, uuids: list[str], in_container: bool) -> dict[str, str]:
        by_uuid = self.inventory.by_uuid()
        gpus = [by_uuid[u] for u in uuids if u in by_uuid]
        return job_env(gpus, bool(self.inventory.gpus), in_container,
                       self.inventory.simulated)

    def set_inventory(self, inventory: Inventory) -> None:
        """A fresh reading of the GPUs: busy and unhealthy ones change what may start."""
        self.inventory = inventory
        if self.queue.capacity.gpus is not None:
            self.queue.capacity.gpus.inventory = inventory
        # Only a GPU broken for good ends the work on it; a failed reading only keeps new
        # work off until the next one.
        broken = {g.uuid: g for g in inventory.gpus if g.fatal}
        for attempt in list(self.active.values()):
            hit = next((broken[u] for u in attempt.gpus if u in broken), None)
            if hit is not None and attempt.lost is None:
                # The work cannot go on there: lost, so it is retried on another GPU.
                attempt.lost = f"GPU {hit.index} unhealthy: {hit.problem or 'unknown'}"
                log.warning("job %s: %s; stopping it", attempt.job.name, attempt.lost)
                if attempt.running:
                    self._spawn(self._signal(attempt, signal.SIGKILL))
        self._kick()

    def set_drained(self, uuid: str, drained: bool) -> None:
        pool = self.queue.capacity.gpus
        if pool is None:
            return
        if drained:
            pool.drained.add(uuid)
        else:
            pool.drained.discard(uuid)
            self._kick()

    def _usage(self, uid: int) -> float:
        """A user's decayed GPU-hours, with what their running jobs used so far."""
        now = time.time()
        cap = self.queue.capacity
        running = sum(req.gpu_count * max(0.0, now - cap.started.get(job_id, now))
                      for job_id, (req, _) in cap.running.items() if req.owner_uid == uid)
        return self.ledger.value(uid, now) + running / 3600

    def _charge(self, req: Request) -> None:
        started = self.queue.capacity.started.get(req.job_id)
        if req.gpu_count and started is not None:
            now = time.time()
            self.ledger.charge(req.owner_uid, req.gpu_count * max(0.0, now - started) / 3600,
                               now)

    def attempt_cost(self, attempt: Attempt) -> float:
        if attempt.meter is None:
            return 0.0
        return attempt.meter.cost(self.inventory, self.settings.gpu_hour_rates,
                                  self.settings.energy_price_per_kwh, time.time())

    def running_cost(self, job_id: int) -> float:
        attempt = self.active.get(job_id)
        return 0.0 if attempt is None else self.attempt_cost(attempt)

    async def watch_costs(self) -> None:
        """Stop a job once it has cost more than its max_cost (every gpu_poll seconds)."""
        while True:
            await asyncio.sleep(self.settings.gpu_poll)
            for attempt in list(self.active.values()):
                try:
                    limit = attempt.job.spec.max_cost
                    if (limit is not None and attempt.running and attempt.stop_reason is None
                            and attempt.job.cost + self.attempt_cost(attempt) > limit):
                        log.info("job %s passed its max_cost of %g", attempt.job.name, limit)
                        # Its own task: one slow stop never delays the others' checks.
                        self._spawn(self._request_stop(attempt, Reason.MAX_COST_EXCEEDED))
                except Exception:
                    log.exception("checking the cost of job %s failed", attempt.job.name)
