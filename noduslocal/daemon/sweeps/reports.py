"""A sweep's documents as the API, the CLI and webhooks see them: its status (phase,
counts, cost, the best cell, failures clustered by error, the estimate) and its cells'
rows, with live cost and metrics for cells that run. A page of sweeps' statuses is built
from one query per part for the whole page, and reads no file (each failed attempt's last
stderr line is kept with its end)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from noduslocal.daemon.jobs.accounting import GpuAccounting
from noduslocal.daemon.store import Store
from noduslocal.daemon.store.rows import CellGroup, FailedCell
from noduslocal.daemon.sweeps import failures, report
from noduslocal.daemon.sweeps.estimate import estimate
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.states import Phase
from noduslocal.domain.sweeps import SweepRecord

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
        return report.cell_row(sweep, job, self.region, self._running_cost(job.id),
                               self._running_metrics(job.id), redact)

    async def cells(self, sweep: SweepRecord, offset: int, limit: int,
                    redact: bool) -> list[dict[str, Any]]:
        jobs = await self.store.sweep_cell_jobs(sweep.id, offset, limit)
        return [self.row(sweep, job, redact) for job in jobs]

    def stderr_line(self, job: JobRecord, number: int) -> str:
        """The last line of attempt `number`'s stderr, as its cell's failure is clustered
        by (blocking: the runner calls it on a thread as the attempt ends)."""
        return failures.last_line(self._log_path(job, number, "stderr"))

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
        groups = await self.store.sweeps_cell_groups(ids, now)
        canaries = await self._canary_jobs(sweeps)
        docs = []
        for sweep, hidden in zip(sweeps, redact, strict=True):
            counts, cost = totals[sweep.id]
            mine = clustered.get(sweep.id, [])
            if hidden:  # stderr is the owner's to read
                mine = [{**g, "error": REDACTED, "exemplar_error": REDACTED} for g in mine]
            top = best.get(sweep.id)
            doc = report.status(sweep, counts, cost,
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
        return estimate(groups, spent, running, self.accounting.gpu_hour_rate,
                        sweep.max_parallel, len(self.accounting.inventory.gpus), now)

    async def _clusters(self, sweep_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
        """The failed cells of each sweep clustered by error, from the stderr lines kept
        with their ends; the files are read (off the loop) only for cells that ended
        before the lines were kept."""
        if not sweep_ids:
            return {}
        failed = await self.store.sweeps_failed(sweep_ids, failures.MAX_CELLS)
        unkept = [c.job_id for cells in failed.values() for c in cells
                  if c.attempts and c.stderr_line is None]
        jobs = await self.store.failed_jobs(unkept) if unkept else {}

        def cluster() -> dict[int, list[dict[str, Any]]]:
            def line_of(cell: FailedCell) -> str:
                if cell.stderr_line is not None:
                    return cell.stderr_line
                return self.stderr_line(jobs[cell.job_id], cell.attempts)

            return {sweep_id: failures.clusters(cells, line_of)
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
