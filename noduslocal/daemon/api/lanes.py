"""Per-user lanes for the heavy reads (listings, pages of a sweep's cells, the queue): each
user has a few such reads in flight and a short line behind them, so one user's many
readers delay another user's read by a bounded amount of work, never by their number.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from noduslocal.domain import errors

PAGE = 1000  # items in one page of a listing at most; a cursor goes on
SLICE = 200  # items built between two yields to the event loop
T = TypeVar("T")


@dataclass
class _Lane:
    gate: asyncio.Semaphore
    users: int = 0  # reads in flight and waiting


@dataclass
class Lanes:
    """`width` heavy reads of one user run at once, `depth` more wait; past that the read
    is refused with a 429 naming the limit (a script that fans out reads gets told)."""

    width: int = 1
    depth: int = 32
    _lanes: dict[int, _Lane] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def read(self, uid: int, user: str, what: str) -> AsyncIterator[None]:
        lane = self._lanes.get(uid)
        if lane is None:
            lane = self._lanes[uid] = _Lane(asyncio.Semaphore(self.width))
        if lane.users >= self.width + self.depth:
            raise errors.ResourceExhausted(
                f"{what}: {user} already has {lane.users} listings in flight or waiting "
                f"(at most {self.width + self.depth}); wait for them to finish")
        lane.users += 1
        try:
            async with lane.gate:
                yield
        finally:
            lane.users -= 1
            if lane.users == 0 and self._lanes.get(uid) is lane:
                del self._lanes[uid]


async def build(items: Iterable[T], make: Callable[[T], dict[str, Any]]) -> list[dict[str, Any]]:
    """`make` of each item, yielding to the event loop every SLICE items, so a page of
    documents never holds the loop for more than a slice's work."""
    docs: list[dict[str, Any]] = []
    for index, item in enumerate(items, 1):
        docs.append(make(item))
        if index % SLICE == 0:
            await asyncio.sleep(0)
    return docs


async def dumps(payload: Any) -> bytes:
    """The JSON of a large answer, encoded on a thread (the loop serves others meanwhile)."""
    return await asyncio.to_thread(lambda: json.dumps(payload).encode())
