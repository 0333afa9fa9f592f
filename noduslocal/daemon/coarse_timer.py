"""Coarse timers: callbacks due a fixed delay after they were added, run by one loop timer
for all of them (each between the delay and twice it), for a check every task asks for
once and most tasks end before: a map's short tasks each armed and cancelled a timer."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class CoarseTimer:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._due: dict[int, tuple[float, Callable[[], object]]] = {}  # in the order added
        self._keys = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, callback: Callable[[], object]) -> int:
        """Run CALLBACK once, `delay` to twice that from now; its key cancels it."""
        loop = asyncio.get_running_loop()
        key = next(self._keys)
        self._due[key] = (loop.time(), callback)
        if self._timer is None:
            self._timer = loop.call_later(self.delay, self._run)
        return key

    def cancel(self, key: int) -> None:
        self._due.pop(key, None)

    def close(self) -> None:
        self._due.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() - self.delay
        for key, (added, callback) in list(self._due.items()):
            if added > due:
                break  # the rest were added later
            del self._due[key]
            try:
                callback()
            except Exception:  # one failing check never keeps the others from theirs
                log.exception("a delayed callback failed")
        self._timer = loop.call_later(self.delay, self._run) if self._due else None
