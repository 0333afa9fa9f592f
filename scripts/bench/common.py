"""Helpers shared by the benchmarks: percentiles and a printed table."""

from __future__ import annotations

import os
import shutil
import statistics
from collections.abc import Sequence
from pathlib import Path


def pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(values: Sequence[float]) -> dict[str, str]:
    ms = [v * 1000 for v in values]
    return {"n": str(len(ms)), "p50 ms": f"{pct(ms, 50):.2f}", "p99 ms": f"{pct(ms, 99):.2f}",
            "mean ms": f"{statistics.fmean(ms):.2f}", "max ms": f"{max(ms):.2f}"}


def table(rows: list[dict[str, str]]) -> str:
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in columns}
    lines = [" | ".join(c.ljust(widths[c]) for c in columns),
             "-|-".join("-" * widths[c] for c in columns)]
    lines += [" | ".join(r.get(c, "").ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def remove_unless_kept(made: Sequence[Path]) -> None:
    """The daemons' directories removed at the end of a run, or left and named with
    BENCH_KEEP=1: on a file system without a journal, inodes deleted in the last minutes
    make every new one dearer, so runs back to back should not follow a mass deletion."""
    if os.environ.get("BENCH_KEEP"):
        print(f"left in place: {' '.join(map(str, made))}")
        return
    for path in made:
        shutil.rmtree(path, ignore_errors=True)
