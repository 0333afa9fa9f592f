"""GPU health and cost over time: a new reading of the GPUs (a foreign process, a lost or
broken GPU) changes what may start and ends the work on a broken GPU as lost, to be
retried on another; drains; and the watch that stops a job past its max_cost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.gpus.model import Inventory
from noduslocal.daemon.jobs.accounting import GpuAccounting
from noduslocal.daemon.jobs.attempt import AttemptLife, Board
from noduslocal.daemon.jobs.stops import Stopper
from noduslocal.daemon.scheduler.capacity import Capacity
from noduslocal.domain.states import Reason

log = logging.getLogger(__name__)


class GpuHealth:
    def __init__(self, live: LiveSettings, capacity: Capacity, accounting: GpuAccounting,
                 board: Board, stopper: Stopper, kick: Callable[[], None]) -> None:
        """`kick`: asks for a queue pass, as what may start changed."""
        self.live = live
        self.capacity = capacity
        self.accounting = accounting
        self.board = board
        self.stopper = stopper
        self._kick = kick

    def set_inventory(self, inventory: Inventory) -> None:
        """A fresh reading of the GPUs: busy and unhealthy ones change what may start."""
        self.accounting.inventory = inventory
        if self.capacity.gpus is not None:
            self.capacity.gpus.inventory = inventory
        # Only a GPU broken for good ends the work on it; a failed reading only keeps new
        # work off until the next one.
        broken = {g.uuid: g for g in inventory.gpus if g.fatal}
        for attempt in list(self.board.active.values()):
            hit = next((broken[u] for u in attempt.gpus if u in broken), None)
            if hit is not None and attempt.lost is None:
                # The work cannot go on there: lost, so it is retried on another GPU.
                attempt.lost = f"GPU {hit.index} unhealthy: {hit.problem or 'unknown'}"
                log.warning("job %s: %s; stopping it", attempt.job.name, attempt.lost)
                if attempt.launched:
                    self.stopper.kill(attempt)
        self._kick()

    def set_drained(self, uuid: str, drained: bool) -> None:
        pool = self.capacity.gpus
        if pool is None:
            return
        if drained:
            pool.drained.add(uuid)
        else:
            pool.drained.discard(uuid)
            self._kick()

    async def watch_costs(self) -> None:
        """Stop a job once it has cost more than its max_cost (every gpu_poll seconds)."""
        while True:
            await asyncio.sleep(self.live.current.gpu_poll)
            for attempt in list(self.board.active.values()):
                try:
                    limit = attempt.job.spec.max_cost
                    if (limit is not None and attempt.life is AttemptLife.RUNNING
                            and attempt.job.cost + self.accounting.attempt_cost(attempt)
                            > limit):
                        log.info("job %s passed its max_cost of %g", attempt.job.name, limit)
                        self.stopper.stop_soon(attempt, Reason.MAX_COST_EXCEEDED)
                except Exception:
                    log.exception("checking the cost of job %s failed", attempt.job.name)
