"""What the lifecycle counts: the GPU picture it works with, what each attempt was given
(the grant a runtime pins), each user's decayed GPU-hours for fair share, and what an
attempt has cost so far.
"""

from __future__ import annotations

import time

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.gpus.model import Inventory
from noduslocal.daemon.jobs.attempt import Attempt
from noduslocal.daemon.runtime.base import GpuGrant
from noduslocal.daemon.scheduler.capacity import Capacity, Request
from noduslocal.daemon.scheduler.fairshare import Ledger
from noduslocal.daemon.store import Store


class GpuAccounting:
    def __init__(self, live: LiveSettings, capacity: Capacity, inventory: Inventory) -> None:
        self.live = live
        self.capacity = capacity
        self.inventory = inventory  # replaced by each new reading (GpuHealth)
        self.ledger = Ledger(live.current.fair_share_half_life)  # not live

    def grant(self, uuids: list[str]) -> GpuGrant:
        by_uuid = self.inventory.by_uuid()
        return GpuGrant(list(uuids), [by_uuid[u] for u in uuids if u in by_uuid],
                        bool(self.inventory.gpus), self.inventory.simulated,
                        tuple(g.device_minor for g in self.inventory.gpus))

    async def replay(self, store: Store) -> None:
        """At start: the fair-share ledger from the attempts of the last ten half-lives."""
        horizon = time.time() - 10 * self.live.current.fair_share_half_life
        for uid, gpus, started, ended in await store.gpu_usage(horizon):
            self.ledger.charge(uid, gpus * max(0.0, ended - started) / 3600, ended)

    def usage(self, uid: int) -> float:
        """A user's decayed GPU-hours, with what their running jobs used so far."""
        now = time.time()
        cap = self.capacity
        running = sum(req.gpu_count * max(0.0, now - cap.started.get(job_id, now))
                      for job_id, (req, _) in cap.running.items() if req.owner_uid == uid)
        return self.ledger.value(uid, now) + running / 3600

    def charge(self, req: Request) -> None:
        """A job let go of its GPUs: the time it held them counts for its owner."""
        started = self.capacity.started.get(req.job_id)
        if req.gpu_count and started is not None:
            now = time.time()
            self.ledger.charge(req.owner_uid, req.gpu_count * max(0.0, now - started) / 3600,
                               now)

    def attempt_cost(self, attempt: Attempt) -> float:
        if attempt.meter is None:
            return 0.0
        return attempt.meter.cost(self.inventory, self.live.current.gpu_hour_rates,
                                  self.live.current.energy_price_per_kwh, time.time())

    def gpu_hour_rate(self, model: str | None) -> float:
        """What a GPU-hour of `model` costs (None: this box's first GPU's model)."""
        rates = self.live.current.gpu_hour_rates
        if model is None:
            model = next((gpu.model for gpu in self.inventory.gpus), "")
        return rates.get(model, rates.get("default", 0.0))
