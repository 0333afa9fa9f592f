"""A sweep's estimate: what all its cells should cost (what is spent, plus what the running
and the waiting cells should still cost at the GPU-hour rate) and when the last should
end, each with the basis it was worked out from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from noduslocal.daemon.store.rows import CellGroup
from noduslocal.domain.states import TERMINAL, Phase
from noduslocal.domain.timefmt import iso

RUNNING = frozenset({Phase.STARTING, Phase.RUNNING})


def _duration(groups: list[CellGroup]) -> tuple[float | None, str]:
    """A cell's expected wall time, and where it comes from."""
    declared = next((g.expected_duration for g in groups if g.expected_duration), None)
    if declared is not None:
        return float(declared), f"expected_duration ({declared:g} s)"
    ended = [g for g in groups if g.phase == Phase.SUCCEEDED and g.ran]
    ran = sum(g.ran for g in ended)
    if ran:
        mean = sum(g.wall for g in ended) / ran
        return mean, f"the mean wall time of {ran} succeeded cells ({mean:.3g} s)"
    return None, "no expected_duration, and no cell has succeeded yet"


def estimate(groups: Iterable[CellGroup], spent: float, running_cost: float,
             rate: Callable[[str | None], float], max_parallel: int, box_gpus: int,
             now: float) -> dict[str, Any]:
    """`spent`: what every ended attempt cost (retried ones too); `running_cost`: what the
    running cells have cost so far; `rate(model)`: a GPU-hour of that model (None: this
    box's); `box_gpus`: how many GPUs the box has, which bounds how many cells run at
    once."""
    groups = list(groups)
    duration, basis = _duration(groups)
    left = [g for g in groups if g.phase not in TERMINAL]
    waiting = [g for g in left if g.phase not in RUNNING]
    running = [g for g in left if g.phase in RUNNING]
    doc: dict[str, Any] = {
        "spent": round(spent + running_cost, 6), "cells_left": sum(g.count for g in left),
        "duration_s": None if duration is None else round(duration, 3), "basis": basis,
        "cost": None, "remaining": None, "finish_in_s": None, "finish_at": None}
    if not left:
        return {**doc, "cost": doc["spent"], "remaining": 0.0, "finish_in_s": 0.0,
                "basis": "every cell has ended"}
    if duration is None:
        return doc
    remaining = 0.0
    for g in waiting:
        remaining += g.count * g.gpus * duration / 3600 * rate(g.model)
    longest_left = 0.0
    for g in running:
        elapsed = g.count * now - g.started  # summed over the group's cells
        left_s = max(0.0, g.count * duration - elapsed)
        remaining += g.gpus * left_s / 3600 * rate(g.model)
        longest_left = max(longest_left, left_s / g.count)
    width = max_parallel
    widest = max((g.gpus for g in waiting), default=0)
    if widest and box_gpus:
        width = max(1, min(width, box_gpus // widest))
    waves = math.ceil(sum(g.count for g in waiting) / width)
    finish = longest_left + waves * duration
    return {**doc, "cost": round(doc["spent"] + remaining, 6),
            "remaining": round(remaining, 6), "finish_in_s": round(finish, 1),
            "finish_at": iso(now + finish),
            "basis": f"{basis} x the GPU-hour rate, {width} cells at once"}
