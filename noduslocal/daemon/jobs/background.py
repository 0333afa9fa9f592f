"""The lifecycle's own background tasks (stops, sweeps, the cost watch), held so they are
not collected, and whether the lifecycle is shutting down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()
        self.closed = False  # shutting down: nothing new starts

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` on its own until it ends or close() cancels it."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
