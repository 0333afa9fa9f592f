"""In-process fan-out of committed changes: the API's event streams, the long polls of
`job wait` and `sweep wait`, and log followers all learn of a job's event or a sweep's
transition here, after its transaction has committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TypeVar

from noduslocal.domain.jobs import Event

STREAM_BACKLOG = 10_000  # events a slow reader may fall behind before it is cut off
T = TypeVar("T")
Topic = tuple[str, int]  # what a long poll waits on: job_topic() or sweep_topic()


def job_topic(job_id: int) -> Topic:
    """Changes with each committed event of the job."""
    return ("job", job_id)


def sweep_topic(sweep_id: int) -> Topic:
    """Changes with each committed transition of the sweep (the sweep controller's)."""
    return ("sweep", sweep_id)


class EventHub:
    def __init__(self) -> None:
        self._streams: set[asyncio.Queue[Event | None]] = set()
        # One future per poll that waits right now; each leaves with its poll, whether
        # the change came, the time ran out, or the caller went away.
        self._waiting: dict[Topic, list[asyncio.Future[None]]] = {}
        self._listeners: list[Callable[[list[Event]], None]] = []

    def waiters(self) -> int:
        """Polls that wait for a change right now (none is left once each has returned)."""
        return sum(len(futures) for futures in self._waiting.values())

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
            self.changed(job_topic(event.job_id))

    def changed(self, topic: Topic) -> None:
        """`topic` changed (committed): wake every poll that waits on it."""
        for future in self._waiting.pop(topic, ()):
            if not future.done():
                future.set_result(None)

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

    def waiting(self, topic: Topic) -> int:
        """How many polls wait on `topic` now."""
        return len(self._waiting.get(topic, ()))

    @contextmanager
    def _watch(self, topic: Topic) -> Iterator[asyncio.Future[None]]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(topic, []).append(future)
        try:
            yield future
        finally:
            future.cancel()  # nobody waits on it any more (a no-op once it is done)
            waiting = self._waiting.get(topic)
            if waiting is not None and future in waiting:
                waiting.remove(future)
                if not waiting:
                    del self._waiting[topic]

    async def next_change(self, topic: Topic, timeout: float) -> None:
        """Return at `topic`'s next change, or after `timeout` seconds."""
        with self._watch(topic) as change, suppress(TimeoutError):
            await asyncio.wait_for(change, timeout)

    async def long_poll(self, topic: Topic, read: Callable[[], Awaitable[T]],
                        done: Callable[[T], bool], timeout: float) -> T:
        """`read()` until `done` says what it read is what the caller waits for, or until
        `timeout` seconds have passed (then as it reads at that moment); read again at
        each change of `topic`. Each read follows registering for the next change, so a
        commit between the two is never missed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            with self._watch(topic) as change:
                value = await read()
                remaining = deadline - loop.time()
                if done(value) or remaining <= 0:
                    return value
                try:
                    await asyncio.wait_for(change, remaining)
                except TimeoutError:
                    return await read()
