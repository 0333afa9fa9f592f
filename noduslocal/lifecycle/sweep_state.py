"""What the sweep controller knows of each running sweep (its held, released and running
cells, the canary, the flags of its async looks), and how many cells a max_cost affords.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from noduslocal.models import JobRecord, SweepRecord


@dataclass
class ActiveSweep:
    record: SweepRecord
    held: deque[int] = field(default_factory=deque)  # cells' job ids not released, in order
    running: set[int] = field(default_factory=set)  # released cells that have not ended
    canary: int | None = None  # the canary cell's job id while the gate is shut
    settling: bool = False  # its end is being worked out
    settle_again: bool = False  # a cell's end was committed meanwhile: look once more
    budgeting: bool = False  # a release within max_cost is being worked out
    ready: dict[int, JobRecord] = field(default_factory=dict)  # held cells, read ahead
    releasing: set[int] = field(default_factory=set)  # released, being read to be queued
    again: bool = False  # ... and something changed meanwhile: work it out once more
    stopping: set[int] = field(default_factory=set)  # running cells a suspend stops


def affordable(spent: float, running: list[float], typical: float, limit: float,
               room: int, held: int) -> int:
    """How many cells may start within `limit`: what was spent, plus each running cell at
    the larger of its cost so far and a typical cell's, plus `typical` for each new one.
    Before any cell has ended (typical 0), only what is spent and running counts."""
    committed = spent + sum(max(cost, typical) for cost in running)
    count = 0
    while (count < min(room, held) and committed < limit
           and committed + typical <= limit):
        count += 1
        committed += typical
    return count
