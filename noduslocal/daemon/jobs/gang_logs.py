"""A gang's logs merged into one file per stream: each line of a rank's log once, prefixed
`[r<n>] `, in the order the daemon read them (a poll apart at most), read in bounded pieces;
resumed after a restart from the offsets it keeps beside them, and made whole when read if
the daemon was away when its ranks ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MERGED = {"all": "merged.log", "stderr": "merged-stderr.log"}
OFFSETS = "merged.json"
POLL = 0.2  # seconds between looks at the ranks' logs
LONGEST_LINE = 1 << 16  # bytes of a line without its newline kept back at most
# Bytes of a rank's log read at a time: with its prefixed copy, all a merge holds in memory
# (a line longer than this is merged in pieces of it).
READ = 1 << 20
# Bytes of each rank's log merged by one step while they run, so a loud rank neither starves
# the others nor keeps its offsets unsaved for long; the next step follows at once.
STEP = 16 << 20

_held: dict[Path, tuple[threading.Lock, list[int]]] = {}  # a lock and how many want it
_held_guard = threading.Lock()


def merged_path(directory: Path, stream: str) -> Path:
    return directory / MERGED[stream]


@contextlib.contextmanager
def _merging(directory: Path) -> Iterator[None]:
    """One merge of a directory at a time: the gang's own and a reader's that finishes it."""
    with _held_guard:
        lock, users = _held.setdefault(directory, (threading.Lock(), [0]))
        users[0] += 1
    try:
        with lock:
            yield
    finally:
        with _held_guard:
            users[0] -= 1
            if not users[0]:
                del _held[directory]


@dataclass
class _Kept:
    """What merged.json keeps: each rank's offset merged so far, the merged files' sizes
    that match them, and whether the last step (after the ranks ended) was taken."""

    offsets: dict[str, list[int]]
    sizes: dict[str, int]
    done: bool = False

    def wire(self) -> dict[str, Any]:
        return {"offsets": self.offsets, "sizes": self.sizes, "done": self.done}


class LogMerger:
    """`log_path(directory, stream, rank)`: where the runtime writes a rank's log. Every step
    reads what merged.json keeps, so any number of mergers of one directory may take turns."""

    def __init__(self, directory: Path, ranks: int,
                 log_path: Callable[[Path, str, int], Path]) -> None:
        self.directory = directory
        self.ranks = ranks
        self.sources = {stream: [log_path(directory, stream, r) for r in range(ranks)]
                        for stream in MERGED}

    def step(self, final: bool = False) -> bool:
        """Append what the ranks wrote since the last step, at most STEP bytes of each;
        `final`: all of it, their last lines too, newline or not. True: more is waiting."""
        with _merging(self.directory):
            kept = self._load()
            was = json.dumps(kept.wire())
            more = False
            for stream, paths in self.sources.items():
                more = self._merge(stream, paths, kept, final) or more
            kept.done = kept.done or final
            if json.dumps(kept.wire()) != was:
                self._save(kept)
            return more

    def finish(self) -> None:
        """The final step, unless it was taken: for an attempt whose ranks have ended."""
        with _merging(self.directory):
            if self._load().done:
                return
        self.step(final=True)

    def _merge(self, stream: str, paths: list[Path], kept: _Kept, final: bool) -> bool:
        more = False
        with open(merged_path(self.directory, stream), "ab") as merged:
            for rank, path in enumerate(paths):
                try:
                    source = path.open("rb")
                except FileNotFoundError:
                    continue
                with source:
                    start = kept.offsets[stream][rank]
                    offset = _merge_rank(source, start, b"[r%d] " % rank, merged, final,
                                         None if final else STEP)
                    more = more or offset - start >= STEP
                kept.offsets[stream][rank] = offset
            kept.sizes[stream] = merged.tell()
        return more

    def _load(self) -> _Kept:
        """The offsets kept, and the merged files cut back to the sizes kept with them:
        what a daemon killed after its write but before its offsets wrote is merged again,
        never twice."""
        kept = self._read() or _Kept({s: [0] * self.ranks for s in MERGED},
                                     dict.fromkeys(MERGED, 0))
        for stream in MERGED:
            path = merged_path(self.directory, stream)
            size = _size(path)
            if size < kept.sizes[stream]:  # not the file the offsets were kept for: anew
                kept.offsets[stream] = [0] * self.ranks
                kept.sizes[stream] = 0
            if size > kept.sizes[stream]:
                os.truncate(path, kept.sizes[stream])
        return kept

    def _read(self) -> _Kept | None:
        try:
            data = json.loads((self.directory / OFFSETS).read_text())
            # An older daemon's offsets alone ({stream: offsets}): its files as they are.
            offsets = data.get("offsets", data)
            sizes = data.get("sizes") or {s: _size(merged_path(self.directory, s))
                                          for s in MERGED}
            kept = _Kept({s: [int(o) for o in offsets[s]] for s in MERGED},
                         {s: int(sizes[s]) for s in MERGED}, data.get("done") is True)
        except (FileNotFoundError, ValueError, TypeError, AttributeError, KeyError):
            return None
        if any(len(o) != self.ranks for o in kept.offsets.values()):
            return None
        return kept

    def _save(self, kept: _Kept) -> None:
        tmp = self.directory / f".{OFFSETS}.tmp"
        tmp.write_text(json.dumps(kept.wire()))
        os.replace(tmp, self.directory / OFFSETS)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _merge_rank(source: Any, offset: int, prefix: bytes, merged: Any, final: bool,
                budget: int | None) -> int:
    """Append the whole lines of `source` from `offset` to `merged`, prefixed, READ bytes
    at a time; returns the offset merged to. A line longer than READ goes in pieces, a last
    line without its newline once it is longer than LONGEST_LINE (or `final`)."""
    source.seek(offset)
    start = offset
    while budget is None or offset - start < budget:
        data = source.read(READ)
        if not data:
            break
        end = data.rfind(b"\n") + 1
        caught_up = len(data) < READ
        if (not caught_up and end == 0) or (caught_up and (
                final or len(data) - end > LONGEST_LINE)):
            end = len(data)
        if end:
            body = data[:end - 1] if data[end - 1] == 10 else data[:end]
            merged.write(prefix)
            merged.write(body.replace(b"\n", b"\n" + prefix))
            merged.write(b"\n")
            offset += end
        if caught_up:
            break
        source.seek(offset)
    return offset


async def follow(merger: LogMerger, stop: asyncio.Event) -> None:
    """Merge every POLL (at once while a step leaves more) until `stop`, then once more
    with the ranks' last lines."""
    while not stop.is_set():
        if await asyncio.to_thread(merger.step):
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL)
    await asyncio.to_thread(merger.step, True)


def finish(directory: Path, ranks: int, log_path: Callable[[Path, str, int], Path]) -> None:
    """Make an ended attempt's merged logs whole, unless they are: the ranks ended while the
    daemon was down, or it died before its last step (a reader's call, on a thread)."""
    if directory.is_dir():
        LogMerger(directory, ranks, log_path).finish()
