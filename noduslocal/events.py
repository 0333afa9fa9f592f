"""In-process fan-out of committed events: the API's event streams, `wait` long polls and
log followers all learn of a transition here, after its transaction has committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from noduslocal.models import Event


class EventHub:
    def __init__(self) -> None:
        self._streams: set[asyncio.Queue[Event]] = set()
        self._watchers: dict[int, list[asyncio.Future[Event]]] = {}

    def publish(self, events: list[Event]) -> None:
        for event in events:
            for queue in self._streams:
                queue.put_nowait(event)
            for future in self._watchers.pop(event.job_id, ()):
                if not future.done():
                    future.set_result(event)

    @contextmanager
    def stream(self) -> Iterator[asyncio.Queue[Event]]:
        """Every event committed from now on, until the block ends."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._streams.add(queue)
        try:
            yield queue
        finally:
            self._streams.discard(queue)

    def next_change(self, job_id: int) -> asyncio.Future[Event]:
        """A future for the job's next committed event."""
        future: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self._watchers.setdefault(job_id, []).append(future)
        return future

    def forget(self, job_id: int, future: asyncio.Future[Event]) -> None:
        waiting = self._watchers.get(job_id)
        if waiting and future in waiting:
            waiting.remove(future)
            if not waiting:
                del self._watchers[job_id]
