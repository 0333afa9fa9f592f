"""The real inventory, through pynvml (the module of nvidia-ml-py): every GPU's identity,
memory, load, power, energy, compute processes and MIG mode, and the links between GPUs.
Blocking: the daemon calls it in a thread. No driver means zero GPUs, said plainly.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pwd
import time
from typing import Any

from noduslocal.daemon.gpus.model import NVLINK, Gpu, GpuProcess, Inventory

log = logging.getLogger(__name__)
_loaded: dict[str, Any] = {}


class Nvml:
    """One nvmlInit for the daemon's life; `read()` gives a fresh inventory each call."""

    def __init__(self, library: str | None = None) -> None:
        self.library = library
        self.ready = False
        self.error = ""

    def open(self) -> None:
        try:
            import pynvml

            if self.library and self.library not in _loaded:
                # Same SONAME as the one pynvml loads by name, so glibc hands it this one.
                _loaded[self.library] = ctypes.CDLL(self.library, mode=ctypes.RTLD_GLOBAL)
            pynvml.nvmlInit()
            self.ready = True
        except Exception as exc:
            self.error = f"NVML unavailable ({exc}); no NVIDIA driver?"
            log.info("%s: running with zero GPUs", self.error)

    def close(self) -> None:
        if self.ready:
            import pynvml

            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
            self.ready = False

    def read(self, previous: Inventory | None = None) -> Inventory:
        if not self.ready:
            return Inventory([], "none", self.error or "NVML not opened")
        import pynvml

        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus: list[Gpu] = []
        handles: list[Any] = []
        known = {g.uuid: g for g in previous.gpus} if previous else {}
        count = pynvml.nvmlDeviceGetCount()
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                gpus.append(_gpu(pynvml, handle, index))
                handles.append(handle)
            except pynvml.NVMLError as exc:
                lost = known.get(next((u for u, g in known.items() if g.index == index), ""))
                # Fallen off the bus is for good; another error may pass by the next read.
                gone = isinstance(exc, pynvml.NVMLError_GpuIsLost)
                gpus.append(Gpu(index, lost.uuid if lost else f"index-{index}",
                                lost.name if lost else "unknown", "",
                                lost.memory_total if lost else 0, healthy=False,
                                problem="fell off the bus (NVML: GPU is lost)" if gone
                                else f"NVML: {exc}", fatal=gone, measured=False))
                handles.append(None)
        # A GPU we knew that NVML no longer lists fell off the bus.
        listed = {g.uuid for g in gpus}
        for uuid, gone in known.items():
            if uuid not in listed and not uuid.startswith("index-"):
                gpus.append(Gpu(len(gpus), uuid, gone.name, gone.pci_bus_id, gone.memory_total,
                                healthy=False, problem="no longer listed by NVML",
                                fatal=True, measured=False))
                handles.append(None)
        levels = [[_level(pynvml, a, b) if i != j else 0 for j, b in enumerate(handles)]
                  for i, a in enumerate(handles)]
        return Inventory(gpus, "nvml", "", levels, driver=driver, read_at=time.time())


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _gpu(pynvml: Any, handle: Any, index: int) -> Gpu:
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    gpu = Gpu(index=index, uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
              name=_text(pynvml.nvmlDeviceGetName(handle)),
              pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
              memory_total=int(memory.total), memory_used=int(memory.used))
    gpu.utilization = _maybe(lambda: int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
    gpu.power_mw = _maybe(lambda: int(pynvml.nvmlDeviceGetPowerUsage(handle)))
    gpu.energy_mj = _maybe(lambda: int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)))
    mig = _maybe(lambda: pynvml.nvmlDeviceGetMigMode(handle))
    gpu.mig = bool(mig and mig[0])
    gpu.numa_node = _maybe(lambda: int(pynvml.nvmlDeviceGetNumaNodeId(handle)))
    gpu.minor = _maybe(lambda: int(pynvml.nvmlDeviceGetMinorNumber(handle)))
    procs = _maybe(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []
    gpu.processes = [GpuProcess(int(p.pid), _memory(p.usedGpuMemory), _user(int(p.pid)))
                     for p in procs]
    return gpu


def _level(pynvml: Any, a: Any, b: Any) -> int:
    if a is None or b is None:
        return 50
    try:
        if pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK) == 0:
            return NVLINK
    except pynvml.NVMLError:
        pass
    try:
        return int(pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b))
    except pynvml.NVMLError:
        return 50


def _maybe(read: Any) -> Any:
    try:
        return read()
    except Exception:  # not supported on this GPU or driver
        return None


def _memory(value: Any) -> int | None:
    # NVML reports "not available" (under some drivers, in containers) as a huge value.
    return None if value is None or value >= 2**63 else int(value)


def _user(pid: int) -> str | None:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
