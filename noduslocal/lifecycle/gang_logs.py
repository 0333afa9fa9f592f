"""A gang's logs merged into one file per stream while its ranks run: each new line of a
rank's log, prefixed `[r<n>]`, in the order the daemon read them (a poll apart at most),
resumed after a restart from the offsets it keeps beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

MERGED = {"all": "merged.log", "stderr": "merged-stderr.log"}
OFFSETS = "merged.json"
POLL = 0.2  # seconds between looks at the ranks' logs
LONGEST_LINE = 1 << 16  # bytes of a line without its newline kept back at most


def merged_path(directory: Path, stream: str) -> Path:
    return directory / MERGED[stream]


class LogMerger:
    """`log_path(directory, stream, rank)`: where the runtime writes a rank's log."""

    def __init__(self, directory: Path, ranks: int,
                 log_path: Callable[[Path, str, int], Path]) -> None:
        self.directory = directory
        self.sources = {stream: [log_path(directory, stream, r) for r in range(ranks)]
                        for stream in MERGED}
        self.offsets = {stream: [0] * ranks for stream in MERGED}
        with contextlib.suppress(FileNotFoundError, ValueError):
            kept = json.loads((directory / OFFSETS).read_text())
            for stream, offsets in kept.items():
                if stream in self.offsets and len(offsets) == ranks:
                    self.offsets[stream] = [int(o) for o in offsets]

    def step(self, final: bool = False) -> None:
        """Append what the ranks wrote since the last step; `final`: their last lines
        too, newline or not."""
        moved = False
        for stream, paths in self.sources.items():
            out = bytearray()
            for rank, path in enumerate(paths):
                offset = self.offsets[stream][rank]
                try:
                    with path.open("rb") as file:
                        file.seek(offset)
                        data = file.read()
                except FileNotFoundError:
                    continue
                end = data.rfind(b"\n") + 1
                if final or len(data) - end > LONGEST_LINE:
                    end = len(data)
                for line in data[:end].splitlines():
                    out += b"[r%d] " % rank + line + b"\n"
                self.offsets[stream][rank] = offset + end
                moved = moved or end > 0
            if out:
                with open(merged_path(self.directory, stream), "ab") as merged:
                    merged.write(out)
        if moved:
            tmp = self.directory / f".{OFFSETS}.tmp"
            tmp.write_text(json.dumps(self.offsets))
            os.replace(tmp, self.directory / OFFSETS)


async def follow(merger: LogMerger, stop: asyncio.Event) -> None:
    """Merge every POLL until `stop`, then once more with the ranks' last lines."""
    while not stop.is_set():
        await asyncio.to_thread(merger.step)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL)
    await asyncio.to_thread(merger.step, True)
