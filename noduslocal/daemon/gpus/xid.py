"""Xid events from NVML, watched in a thread: an Xid that means a broken GPU (not one an
application causes) is reported, with the GPU's UUID, for the daemon to mark it unhealthy
and move its work elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
# Xids that mean the GPU (or its link, memory, or driver state) is broken: reset needed.
FATAL_XIDS = frozenset({48, 61, 62, 63, 64, 69, 74, 79, 92, 94, 95, 119, 120})
# Xids that an application causes (bad memory access, illegal instruction, ...).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
WAIT_MS = 2000


def describe(xid: int) -> str:
    return {48: "double-bit ECC error", 63: "ECC page retirement failed",
            64: "ECC page retirement failed", 74: "NVLink error",
            79: "fell off the bus", 92: "high single-bit ECC rate",
            94: "contained ECC error", 95: "uncontained ECC error"}.get(xid, "GPU error")


class XidWatch:
    def __init__(self, on_fatal: Callable[[str, int], None]) -> None:
        self.on_fatal = on_fatal  # (uuid, xid), called from the watch thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(WAIT_MS / 1000 + 1)

    def _run(self) -> None:
        import pynvml

        try:
            events = pynvml.nvmlEventSetCreate()
            uuids: dict[Any, str] = {}
            for index in range(pynvml.nvmlDeviceGetCount()):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    pynvml.nvmlDeviceRegisterEvents(
                        handle, pynvml.nvmlEventTypeXidCriticalError, events)
                    uuid = pynvml.nvmlDeviceGetUUID(handle)
                    uuids[_key(handle)] = uuid.decode() if isinstance(uuid, bytes) else uuid
                except pynvml.NVMLError as exc:
                    log.warning("GPU %d: no Xid events (%s)", index, exc)
        except Exception as exc:
            log.warning("Xid events unavailable: %s", exc)
            return
        try:
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(events, WAIT_MS)
                except pynvml.NVMLError_Timeout:
                    continue
                except pynvml.NVMLError as exc:
                    log.warning("waiting for Xid events failed: %s", exc)
                    self._stop.wait(WAIT_MS / 1000)
                    continue
                xid, uuid = int(data.eventData), uuids.get(_key(data.device))
                if uuid is None:
                    continue
                if xid in FATAL_XIDS:
                    log.error("Xid %d (%s) on %s: marking it unhealthy", xid, describe(xid),
                              uuid)
                    self.on_fatal(uuid, xid)
                else:
                    log.info("Xid %d on %s (%s)", xid, uuid,
                             "caused by an application" if xid in APPLICATION_XIDS
                             else "not known to break the GPU")
        finally:
            with contextlib.suppress(Exception):
                pynvml.nvmlEventSetFree(events)


def _key(handle: Any) -> int:
    """A device handle's address, comparable across calls."""
    import ctypes

    return ctypes.cast(handle, ctypes.c_void_p).value or 0
