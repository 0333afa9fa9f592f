"""A sweep's documents as the API, the CLI and webhooks see them: its status (phase, counts,
cost, the best cell, failed cells clustered by error, the cost and finish estimate) and its
cells' rows with live cost and metrics. A page of statuses costs one query per part for the
whole page and reads no file (a failed attempt's last stderr line is kept with its end)."""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from noduslocal.daemon.files.plain import open_plain
from noduslocal.daemon.jobs.accounting import GpuAccounting
from noduslocal.daemon.store import Store
from noduslocal.daemon.store.rows import CellGroup, FailedCell, asks_of
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.states import TERMINAL, Phase
from noduslocal.domain.sweeps import SweepRecord
from noduslocal.domain.timefmt import iso

REDACTED = "***"


class SweepReports:
    def __init__(self, store: Store, region: str, accounting: GpuAccounting,
                 running_cost: Callable[[int], float],
                 running_metrics: Callable[[int], dict[str, float] | None],
                 log_path: Callable[[JobRecord, int, str], Path]) -> None:
        self.store = store
        self.region = region
        self.accounting = accounting
        self._running_cost = running_cost
        self._running_metrics = running_metrics
        self._log_path = log_path

    def row(self, sweep: SweepRecord, job: JobRecord, redact: bool) -> dict[str, Any]:
        return cell_row(sweep, job, self.region, self._running_cost(job.id),
                               self._running_metrics(job.id), redact)

    async def cells(self, sweep: SweepRecord, offset: int, limit: int,
                    redact: bool) -> list[dict[str, Any]]:
        jobs = await self.store.sweep_cell_jobs(sweep.id, offset, limit)
        return [self.row(sweep, job, redact) for job in jobs]

    def stderr_line(self, job: JobRecord, number: int) -> str:
        """The last line of attempt `number`'s stderr, as its cell's failure is clustered
        by (blocking: the runner calls it on a thread as the attempt ends)."""
        return last_line(self._log_path(job, number, "stderr"))

    async def status(self, sweep: SweepRecord, redact: bool) -> dict[str, Any]:
        """`redact`: for a caller who is not the owner (parameters and stderr hidden)."""
        return (await self.statuses([sweep], [redact]))[0]

    async def statuses(self, sweeps: Sequence[SweepRecord],
                       redact: Sequence[bool]) -> list[dict[str, Any]]:
        """Each sweep's status, as status() makes it, with the same queries however many
        sweeps there are (`redact`: each sweep's)."""
        if not sweeps:
            return []
        ids = [sweep.id for sweep in sweeps]
        totals = await self.store.sweeps_totals(ids)
        best = await self.store.sweeps_best(ids)
        failing = [i for i in ids if totals[i][0].get(Phase.FAILED)]
        clustered = await self._clusters(failing)
        running = await self.store.sweeps_running(ids)
        now = time.time()
        groups = await self.store.sweeps_cell_groups(
            ids, now, {sweep.id: asks_of(sweep.spec.template) for sweep in sweeps
                       if sweep.spec.cells_alike()})
        canaries = await self._canary_jobs(sweeps)
        docs = []
        for sweep, hidden in zip(sweeps, redact, strict=True):
            counts, cost = totals[sweep.id]
            mine = clustered.get(sweep.id, [])
            if hidden:  # stderr is the owner's to read
                mine = [{**g, "error": REDACTED, "exemplar_error": REDACTED} for g in mine]
            top = best.get(sweep.id)
            doc = status_doc(sweep, counts, cost,
                                None if top is None else self.row(sweep, top, hidden), mine)
            running_cost = sum(self._running_cost(j) for j in running[sweep.id])
            docs.append({**doc, "canary_job": canaries.get(sweep.id),
                         "estimate": self._estimate(sweep, groups[sweep.id], cost,
                                                    running_cost, now)})
        return docs

    def _estimate(self, sweep: SweepRecord, groups: list[CellGroup], spent: float,
                  running: float, now: float) -> dict[str, Any]:
        """What every cell should cost and when the last should end (`spent`: what its
        ended attempts cost; `running`: what its running cells have cost so far)."""
        box = self.accounting.capacity
        return estimate(groups, spent, running, self.accounting.gpu_hour_rate,
                        sweep.max_parallel, len(self.accounting.inventory.gpus), now,
                        box.cpu_m / 1000, box.memory)

    async def _clusters(self, sweep_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
        """The failed cells of each sweep clustered by error, from the stderr lines kept
        with their ends; the files are read (off the loop) only for cells that ended
        before the lines were kept."""
        if not sweep_ids:
            return {}
        failed = await self.store.sweeps_failed(sweep_ids, MAX_CELLS)
        unkept = [c.job_id for cells in failed.values() for c in cells
                  if c.attempts and c.stderr_line is None]
        jobs = await self.store.failed_jobs(unkept) if unkept else {}

        def cluster() -> dict[int, list[dict[str, Any]]]:
            def line_of(cell: FailedCell) -> str:
                if cell.stderr_line is not None:
                    return cell.stderr_line
                return self.stderr_line(jobs[cell.job_id], cell.attempts)

            return {sweep_id: clusters(cells, line_of)
                    for sweep_id, cells in failed.items()}

        return await asyncio.to_thread(cluster)

    async def _canary_jobs(self, sweeps: Sequence[SweepRecord]) -> dict[int, str]:
        """The name of the job that gates each sweep: the smoke command's, or its first
        cell's; none for a sweep without a canary."""
        smoke = {sweep.id: int(sweep.spec.smoke_job) for sweep in sweeps
                 if sweep.spec.canary != "none" and sweep.spec.smoke_job is not None}
        gated = [sweep.id for sweep in sweeps
                 if sweep.spec.canary != "none" and sweep.spec.smoke_job is None]
        names = await self.store.job_names(list(smoke.values())) if smoke else {}
        firsts = await self.store.sweeps_first_cells(gated) if gated else {}
        return {**{sweep_id: names[job_id] for sweep_id, job_id in smoke.items()
                   if job_id in names}, **firsts}


# A sweep's report: each cell's row (GPU, region, parameters, phase, cost, wall time) in
# index order, and the sweep's status (phase, counts per phase, total cost).

def cell_row(sweep: SweepRecord, job: JobRecord, region: str, running_cost: float,
             live_metrics: dict[str, float] | None, redact: bool) -> dict[str, Any]:
    assert job.cell is not None
    metrics = live_metrics or job.metrics
    params = sweep.spec.params(job.cell)
    shown = dict.fromkeys(params, "***") if redact else params
    end = job.ended_at or (time.time() if job.started_at else None)
    return {
        "index": job.cell,
        "name": job.name,
        "gpu": job.spec.gpu.describe() if job.spec.gpu is not None else None,
        "region": params.get("region", job.spec.region or region),
        "parameters": shown,  # the reference's word
        "params": dict(shown),  # the name it had first, kept for existing callers
        "phase": job.phase,
        "reason": job.reason,
        "message": job.message,
        "exit_code": job.exit_code,
        "attempts": job.attempts,
        "cost": round(job.cost + running_cost, 6),
        "wall_s": None if not job.started_at or not end else round(end - job.started_at, 3),
        "throughput": metrics.get("throughput"),
        "metrics": metrics,
    }


def status_doc(sweep: SweepRecord, counts: dict[str, int], cost: float,
               best: dict[str, Any] | None, failures: list[dict[str, Any]]) -> dict[str, Any]:
    """`best`: the row of the succeeded cell with the highest throughput (lower cost on a
    tie), None until one reported it; `failures`: failed cells clustered by error."""
    done = sum(counts.get(p, 0) for p in ("Succeeded", "Failed", "Cancelled"))
    return {**sweep.to_wire(), "counts": counts, "done": done, "cost": round(cost, 6),
            "best": best, "failures": failures}


# Failed cells clustered by error: the exit code plus the last line of stderr with
# numbers, paths and hex ids made alike, so 400 failures read as the two causes they are.
# The line is kept with each attempt's end (last_line, read then); an older end's is read
# from its file.

TAIL = 4096  # bytes of stderr read for its last line
MAX_CELLS = 1000  # failed cells looked at; the rest are counted, not read
EXAMPLES = 5
_PATH = re.compile(r"(?:[A-Za-z0-9_.~-]*/)+[A-Za-z0-9_.-]+")
# A search path (PATH, LD_LIBRARY_PATH, PYTHONPATH) is one thing, not a path each entry:
# made alike entry by entry it read `PATH:PATH:PATH:...`, which says nothing.
_SEARCH_PATH = re.compile(r"(?:[A-Za-z0-9_.~-]*/[A-Za-z0-9_./~-]*)?"
                          r"(?::(?:[A-Za-z0-9_.~-]*/[A-Za-z0-9_./~-]*)?)+"
                          r"(?<=[A-Za-z0-9_.~/-])")
_HEX = re.compile(r"\b(?:0x[0-9a-fA-F]+|[0-9a-fA-F]{8,})\b")
_NUMBER = re.compile(r"(?<![A-Za-z])\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def normalise(line: str) -> str:
    line = _SEARCH_PATH.sub(_search_path, line.strip())
    line = _PATH.sub("PATH", line)
    line = _HEX.sub("HEX", line)
    return _NUMBER.sub("N", line)[:300]


def _search_path(match: re.Match[str]) -> str:
    """Two or more directories joined by ':' become one SEARCHPATH; anything else with a
    colon (`file.py:12:`, `error: x`) is left to the other rules."""
    entries = [e for e in match.group(0).split(":") if e]
    return "SEARCHPATH" if len(entries) >= 2 and all("/" in e for e in entries) \
        else match.group(0)


def last_line(path: Path) -> str:
    try:
        with open_plain(path) as file:  # a cluster's logs are written as the job's owner
            file.seek(0, 2)
            size = file.tell()
            file.seek(max(0, size - TAIL))
            data = file.read()
    except OSError:
        return ""
    lines = [x for x in data.decode("utf-8", "replace").splitlines() if x.strip()]
    return lines[-1] if lines else ""


def clusters(failed: list[FailedCell],
             line_of: Callable[[FailedCell], str]) -> list[dict[str, Any]]:
    """Groups of failed cells, the largest first: exit code, normalised error, how many,
    the first few cells and an exemplar (the first) with its error as it was.
    `line_of(cell)`: the last line of its last attempt's stderr."""
    groups: dict[tuple[int | None, str], dict[str, Any]] = {}
    for cell in failed[:MAX_CELLS]:
        line = line_of(cell) if cell.attempts else ""
        key = (cell.exit_code, normalise(line) or (cell.message or cell.reason or ""))
        group = groups.setdefault(key, {"exit_code": key[0], "error": key[1], "count": 0,
                                        "cells": [], "exemplar": cell.cell,
                                        "exemplar_job": cell.name,
                                        "exemplar_error": line or cell.message})
        group["count"] += 1
        if len(group["cells"]) < EXAMPLES:
            group["cells"].append(cell.cell)
    return sorted(groups.values(), key=lambda g: (-g["count"], g["exemplar"]))


# A sweep's estimate: what all its cells should cost (what is spent, plus what the running
# and the waiting cells should still cost at the GPU-hour rate) and when the last should
# end, each with the basis it was worked out from.

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
             now: float, box_cpu: float | None = None,
             box_memory: int | None = None) -> dict[str, Any]:
    """`spent`: what every ended attempt cost (retried ones too); `running_cost`: what the
    running cells have cost so far; `rate(model)`: a GPU-hour of that model (None: this
    box's); `box_gpus`, `box_cpu`, `box_memory`: what the box has, which bounds how many
    cells run at once."""
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
    # As many as the box's CPUs and memory hold at once, too (8 allowed, 2 cores: 2).
    cpu = max((g.cpu for g in waiting), default=0.0)
    if cpu and box_cpu:
        width = max(1, min(width, int(box_cpu // cpu)))
    memory = max((g.memory for g in waiting), default=0)
    if memory and box_memory:
        width = max(1, min(width, box_memory // memory))
    waves = math.ceil(sum(g.count for g in waiting) / width)
    finish = longest_left + waves * duration
    return {**doc, "cost": round(doc["spent"] + remaining, 6),
            "remaining": round(remaining, 6), "finish_in_s": round(finish, 1),
            "finish_at": iso(now + finish),
            "basis": f"{basis} x the GPU-hour rate, {width} cells at once"}
