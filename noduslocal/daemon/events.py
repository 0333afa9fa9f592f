"""In-process fan-out of committed events: the API's event streams, `wait` long polls and
log followers all learn of a transition here, after its transaction has committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from noduslocal.domain.jobs import Event

STREAM_BACKLOG = 10_000  # events a slow reader may fall behind before it is cut off


class EventHub:
    def __init__(self) -> None:
        self._streams: set[asyncio.Queue[Event | None]] = set()
        self._watchers: dict[int, list[asyncio.Future[Event]]] = {}
        self._listeners: list[Callable[[list[Event]], None]] = []

    def listen(self, listener: Callable[[list[Event]], None]) -> None:
        """Call `listener` with every batch of committed events (the lifecycle's sweeps)."""
        self._listeners.append(listener)

    def publish(self, events: list[Event]) -> None:
        for listener in self._listeners:
            listener(events)
        for event in events:
            for queue in list(self._streams):
                try:
                    queue.put_nowait(event)
                except asyncio.QueueFull:
                    # Cut off rather than grow without bound: the reader gets None, ends its
                    # stream, and may reconnect with since=<the last seq it saw>.
                    self._streams.discard(queue)
                    while not queue.empty():
                        queue.get_nowait()
                    queue.put_nowait(None)
            for future in self._watchers.pop(event.job_id, ()):
                if not future.done():
                    future.set_result(event)

    @contextmanager
    def stream(self) -> Iterator[asyncio.Queue[Event | None]]:
        """Every event committed from now on, until the block ends; None when the reader
        fell too far behind and was cut off."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue(STREAM_BACKLOG)
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
