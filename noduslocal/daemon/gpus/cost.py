"""What a job's GPUs cost while it holds them: the energy each GPU used (NVML's energy
counter, delta since the attempt started) times the price per kWh, plus a rate per
GPU-hour by model, both from the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from noduslocal.daemon.gpus.model import Inventory

MJ_PER_KWH = 3.6e9


@dataclass
class Meter:
    started: float
    energy_start: dict[str, int | None]  # uuid -> the energy counter (mJ) at the start

    @classmethod
    def start(cls, uuids: list[str], inventory: Inventory, now: float) -> Meter:
        by_uuid = inventory.by_uuid()
        return cls(now, {u: by_uuid[u].energy_mj if u in by_uuid else None for u in uuids})

    def cost(self, inventory: Inventory, rates: Mapping[str, float], price_per_kwh: float,
             now: float) -> float:
        hours = max(0.0, now - self.started) / 3600
        by_uuid = inventory.by_uuid()
        total = 0.0
        for uuid, start in self.energy_start.items():
            gpu = by_uuid.get(uuid)
            model = gpu.model if gpu is not None else ""
            total += hours * rates.get(model, rates.get("default", 0.0))
            if gpu is not None and gpu.energy_mj is not None and start is not None:
                total += max(0, gpu.energy_mj - start) / MJ_PER_KWH * price_per_kwh
        return total
