"""Each GPU's readings over the last hour: utilisation, memory used, power, and whether a job
here held it, kept per GPU (by UUID) in a ring of fixed capacity fed by the daemon's NVML
polls; and the columnar view of them that the API serves (what a uPlot chart takes as is).
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable, Collection
from typing import Any

from noduslocal.daemon.gpus.model import Gpu, Inventory

WINDOW = 3600.0  # seconds of readings kept
# A reading closer than this to a GPU's newest sample is not kept, so a tiny gpu_poll
# cannot make the rings large: at most WINDOW / MIN_GAP (40,000) samples a GPU. Below
# 0.1 s, the common fastest poll, so timer slack never thins a 0.1 s poll.
MIN_GAP = 0.09
NONE = -1  # in the integer columns: NVML gave no value
# The columns of a ring, as (array typecode, the value of an empty slot): the time (unix
# seconds), utilisation (%), memory used (bytes), power (mW), held by a job here (0/1).
# 22 bytes a sample.
COLUMNS = {"t": ("d", 0.0), "utilization": ("b", NONE), "memory_used": ("q", NONE),
           "power": ("i", NONE), "allocated": ("b", 0)}


class _Ring:
    """One GPU's samples: column arrays of `capacity` slots allocated at once, the oldest
    at `start`, `size` of them filled; a new sample past capacity overwrites the oldest."""

    __slots__ = ("capacity", "columns", "index", "memory_total", "name", "size", "start")

    def __init__(self, capacity: int, index: int, name: str, memory_total: int) -> None:
        self.index, self.name, self.memory_total = index, name, memory_total
        self.capacity = capacity
        self.start = 0
        self.size = 0
        self.columns = {name: array(code, [empty]) * capacity
                        for name, (code, empty) in COLUMNS.items()}

    def describe(self, gpu: Gpu) -> None:
        """Its index, name and memory as NVML lists it now (an index may change)."""
        self.index, self.name, self.memory_total = gpu.index, gpu.name, gpu.memory_total

    @property
    def newest(self) -> float:
        return self.columns["t"][(self.start + self.size - 1) % self.capacity]

    def append(self, values: dict[str, float | int]) -> None:
        slot = (self.start + self.size) % self.capacity
        for name, column in self.columns.items():
            column[slot] = values[name]
        if self.size < self.capacity:
            self.size += 1
        else:
            self.start = (self.start + 1) % self.capacity

    def ordered(self, name: str) -> array[Any]:
        """A column's filled slots, oldest first (a copy)."""
        column, end = self.columns[name], self.start + self.size
        if end <= self.capacity:
            return column[self.start:end]
        return column[self.start:] + column[:end - self.capacity]

    def resized(self, capacity: int) -> _Ring:
        """A ring of `capacity` slots holding this one's newest samples that fit."""
        ring = _Ring(capacity, self.index, self.name, self.memory_total)
        keep = {name: self.ordered(name)[-capacity:].tolist() for name in self.columns}
        for i in range(len(keep["t"])):
            ring.append({name: values[i] for name, values in keep.items()})
        return ring

    def nbytes(self) -> int:
        return sum(c.itemsize * c.buffer_info()[1] for c in self.columns.values())


class GpuHistory:
    """The rings of every GPU read in the last `window` seconds. `record` takes each NVML
    reading (GpuService calls it after every poll); `held` says which GPUs (UUIDs) a job
    here holds at that moment. A GPU that leaves the readings keeps its ring until its
    newest sample is older than the window."""

    def __init__(self, period: float, held: Callable[[], Collection[str]],
                 window: float = WINDOW) -> None:
        self.window = window
        self.held = held
        self.period = period
        self.capacity = self._capacity(period)
        self._rings: dict[str, _Ring] = {}  # by UUID

    def _capacity(self, period: float) -> int:
        return max(1, math.ceil(self.window / max(period, MIN_GAP)))

    def resize(self, period: float) -> None:
        """gpu_poll changed: the rings are made to hold a window's samples at the new pace,
        keeping the newest samples that fit."""
        self.period = period
        capacity = self._capacity(period)
        if capacity != self.capacity:
            self.capacity = capacity
            self._rings = {uuid: ring.resized(capacity) for uuid, ring in self._rings.items()}

    def record(self, inventory: Inventory) -> None:
        """One reading of the GPUs: a sample for each GPU, with no values where NVML gave
        none. A GPU never measured (simulated, or unreadable from the first) gets no ring."""
        at = inventory.read_at or time.time()
        held = self.held()
        for gpu in inventory.gpus:
            ring = self._rings.get(gpu.uuid)
            if ring is None:
                if not gpu.measured:
                    continue
                ring = self._rings[gpu.uuid] = _Ring(self.capacity, gpu.index, gpu.name,
                                                     gpu.memory_total)
            elif ring.newest <= at < ring.newest + MIN_GAP:
                continue
            ring.describe(gpu)
            ring.append(_sample(gpu, at, gpu.uuid in held))
        for uuid in [u for u, ring in self._rings.items() if ring.newest <= at - self.window]:
            del self._rings[uuid]

    def view(self, inventory: Inventory, since: float | None = None,
             index: int | None = None, now: float | None = None) -> dict[str, Any]:
        """The GpuHistory document: each GPU listed now (in `inventory`, the picture now)
        and each that left it with samples in the window, as columns of equal length,
        oldest first: `t` (unix seconds), `utilization` (%), `memory_used` (bytes), `power`
        (W), `allocated` (1: a job here held it), null where NVML gave no value. SINCE: only
        samples newer than it. INDEX: only the GPU(s) of that index."""
        now = time.time() if now is None else now
        cutoff = max(now - self.window, since if since is not None else -math.inf)
        listed = {g.uuid for g in inventory.gpus}
        gone = sorted(((u, r) for u, r in self._rings.items() if u not in listed),
                      key=lambda item: item[1].index)
        gpus = []
        for gpu in inventory.gpus:
            if index is None or gpu.index == index:
                gpus.append(self._columns(gpu.uuid, gpu.index, gpu.name, gpu.memory_total,
                                          cutoff))
        for uuid, ring in gone:
            if index is None or ring.index == index:
                gpus.append(self._columns(uuid, ring.index, ring.name, ring.memory_total,
                                          cutoff))
        return {"kind": "GpuHistory", "interval": self.period, "window": self.window,
                "source": inventory.source, "note": _note(inventory), "gpus": gpus}

    def indexes(self, inventory: Inventory) -> set[int]:
        """The GPU indexes a view can name: those listed now and those of departed GPUs
        still in the window."""
        return {g.index for g in inventory.gpus} | {r.index for r in self._rings.values()}

    def nbytes(self) -> int:
        """Bytes the rings' arrays hold (the samples' storage, not the Python objects)."""
        return sum(ring.nbytes() for ring in self._rings.values())

    def _columns(self, uuid: str, index: int, name: str, memory_total: int,
                 cutoff: float) -> dict[str, Any]:
        doc: dict[str, Any] = {"index": index, "uuid": uuid, "name": name,
                               "memory_total": memory_total}
        ring = self._rings.get(uuid)
        if ring is None:
            return {**doc, **{name: [] for name in COLUMNS}}
        times = ring.ordered("t")
        # From the first sample past the cutoff on, in the order they were read (a clock
        # set back leaves its samples in that order rather than dropping them).
        first = next((i for i, t in enumerate(times) if t > cutoff), len(times))
        power = _values(ring.ordered("power")[first:])
        return {**doc, "t": times[first:].tolist(),
                "utilization": _values(ring.ordered("utilization")[first:]),
                "memory_used": _values(ring.ordered("memory_used")[first:]),
                "power": [None if mw is None else mw / 1000 for mw in power],
                "allocated": ring.ordered("allocated")[first:].tolist()}


def _values(column: array[int]) -> list[int | None]:
    """An integer column as JSON takes it: null where NVML gave no value."""
    if NONE not in column:  # the common case, all in C
        return column.tolist()  # type: ignore[return-value]
    return [None if v == NONE else v for v in column]


def _sample(gpu: Gpu, at: float, held: bool) -> dict[str, float | int]:
    if not gpu.measured:
        return {"t": at, "utilization": NONE, "memory_used": NONE, "power": NONE,
                "allocated": int(held)}
    return {"t": at, "utilization": _whole(gpu.utilization, 100),
            "memory_used": _whole(gpu.memory_used, 2**63 - 1),
            "power": _whole(gpu.power_mw, 2**31 - 1), "allocated": int(held)}


def _whole(value: float | None, top: int) -> int:
    """A reading as its column holds it: NONE for a missing, NaN or impossible value."""
    if value is None or not math.isfinite(value) or not 0 <= value <= top:
        return NONE
    return int(value)


def _note(inventory: Inventory) -> str:
    if inventory.source == "simulated":
        return "simulated GPUs have no readings: no history is kept for them"
    if inventory.source == "none":
        return inventory.note or "no GPUs"
    return ""
