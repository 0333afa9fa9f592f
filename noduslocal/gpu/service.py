"""The daemon's GPU picture over time: NVML (or a simulation, or nothing) read at start
and then every `gpu_poll` seconds in a thread, handed to the supervisor so a foreign
process or a lost GPU changes what may start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from noduslocal.config import Settings
from noduslocal.gpu import simulated
from noduslocal.gpu.model import Inventory
from noduslocal.gpu.nvml import Nvml

log = logging.getLogger(__name__)


class GpuService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.nvml: Nvml | None = None
        self.inventory = Inventory([], "none", "not read yet")
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Inventory:
        if self.settings.simulate_gpus:
            self.inventory = simulated.parse(self.settings.simulate_gpus)
            log.warning("SIMULATED GPUs (no NVML): %s", self.inventory.summary())
            return self.inventory
        self.nvml = Nvml(self.settings.nvml_library)
        await asyncio.to_thread(self.nvml.open)
        self.inventory = await asyncio.to_thread(self.nvml.read)
        if self.inventory.gpus:
            log.info("GPUs (NVML, driver %s): %s", self.inventory.driver,
                     self.inventory.summary())
        else:
            log.info("zero GPUs: %s", self.inventory.note or "none found")
        return self.inventory

    def watch(self, on_change: Callable[[Inventory], None]) -> None:
        if self.nvml is not None and self.nvml.ready:
            self._task = asyncio.create_task(self._poll(on_change), name="gpu-poll")

    async def _poll(self, on_change: Callable[[Inventory], None]) -> None:
        assert self.nvml is not None
        while True:
            await asyncio.sleep(self.settings.gpu_poll)
            try:
                self.inventory = await asyncio.to_thread(self.nvml.read, self.inventory)
            except Exception:
                log.exception("reading the GPUs failed")
                continue
            on_change(self.inventory)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.nvml is not None:
            await asyncio.to_thread(self.nvml.close)
