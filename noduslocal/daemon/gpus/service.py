"""The daemon's GPU picture over time: NVML (or a simulation, or nothing) read at start
and then every `gpu_poll` seconds in a thread, handed to the supervisor so a foreign
process or a lost GPU changes what may start, and each reading to the GPUs' history; and
the simulated inventory itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.config.values import simulated_groups
from noduslocal.daemon.gpus.history import GpuHistory
from noduslocal.daemon.gpus.model import NVLINK, Gpu, Inventory
from noduslocal.daemon.gpus.nvml import Nvml
from noduslocal.daemon.gpus.xid import XidWatch, describe

log = logging.getLogger(__name__)


class GpuService:
    def __init__(self, live: LiveSettings, history: GpuHistory | None = None) -> None:
        self.live = live
        self.history = history  # given each NVML reading of the polls
        self.nvml: Nvml | None = None
        self.inventory = Inventory([], "none", "not read yet")
        self._task: asyncio.Task[None] | None = None
        self._xids: XidWatch | None = None
        self._on_change: Callable[[Inventory], None] | None = None
        # GPUs an Xid broke: they stay unhealthy until the daemon restarts (after a reset).
        self.broken: dict[str, str] = {}

    async def start(self) -> Inventory:
        if self.live.current.simulate_gpus:
            self.inventory = simulated_inventory(self.live.current.simulate_gpus)
            log.warning("SIMULATED GPUs (no NVML): %s", self.inventory.summary())
            return self.inventory
        self.nvml = Nvml(self.live.current.nvml_library)
        await asyncio.to_thread(self.nvml.open)
        self.inventory = await asyncio.to_thread(self.nvml.read)
        if self.inventory.gpus:
            log.info("GPUs (NVML, driver %s): %s", self.inventory.driver,
                     self.inventory.summary())
        else:
            log.info("zero GPUs: %s", self.inventory.note or "none found")
        return self.inventory

    def watch(self, on_change: Callable[[Inventory], None]) -> None:
        self._on_change = on_change
        if self.nvml is not None and self.nvml.ready:
            self._task = asyncio.create_task(self._poll(on_change), name="gpu-poll")
            loop = asyncio.get_running_loop()
            self._xids = XidWatch(lambda uuid, xid: loop.call_soon_threadsafe(
                self.mark_broken, uuid, f"Xid {xid} ({describe(xid)})"))
            self._xids.start()

    def mark_broken(self, uuid: str, why: str) -> None:
        self.broken[uuid] = why
        self._apply(self.inventory)
        if self._on_change is not None:
            self._on_change(self.inventory)

    def _apply(self, inventory: Inventory) -> None:
        for gpu in inventory.gpus:
            if gpu.uuid in self.broken:
                gpu.healthy, gpu.problem, gpu.fatal = False, self.broken[gpu.uuid], True

    async def _poll(self, on_change: Callable[[Inventory], None]) -> None:
        assert self.nvml is not None
        while True:
            await asyncio.sleep(self.live.current.gpu_poll)
            try:
                inventory = await asyncio.to_thread(self.nvml.read, self.inventory)
            except Exception:
                log.exception("reading the GPUs failed")
                continue
            self._apply(inventory)
            self.inventory = inventory
            on_change(self.inventory)
            if self.history is not None:  # after on_change: who holds each GPU is current
                self.history.record(inventory)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._xids is not None:
            await asyncio.to_thread(self._xids.stop)
        if self.nvml is not None:
            await asyncio.to_thread(self.nvml.close)


def simulated_inventory(spec: str) -> Inventory:
    """A simulated inventory for machines without GPUs: `--simulate-gpus "4xH100-80GB,2xL4"`.
    GPUs of one group are NVLinked in pairs, groups sit on separate NUMA nodes; everything
    built from it is marked simulated."""
    gpus: list[Gpu] = []
    groups: list[int] = []
    for group, (count, model, memory_gib) in enumerate(simulated_groups(spec)):
        for _ in range(count):
            index = len(gpus)
            gpus.append(Gpu(
                index=index, uuid=f"GPU-51a0{index:04x}-0000-4000-8000-{index:012x}",
                name=f"NVIDIA {model} {memory_gib}GB (simulated)",
                pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
                memory_total=memory_gib * 2**30, utilization=0, power_mw=0, energy_mj=0,
                numa_node=group, measured=False))
            groups.append(group)
    n = len(gpus)
    levels = [[0 if i == j else NVLINK if groups[i] == groups[j] and i // 2 == j // 2
               else 30 if groups[i] == groups[j] else 50 for j in range(n)] for i in range(n)]
    return Inventory(gpus, "simulated", f"simulated: {spec}", levels, driver="simulated")
