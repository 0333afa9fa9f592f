"""A sweep's documents as the API, the CLI and webhooks see them: its status (phase,
counts, cost, the best cell, failures clustered by error, the estimate) and its cells'
rows, with live cost and metrics for cells that run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from noduslocal.daemon.jobs.accounting import GpuAccounting
from noduslocal.daemon.store import Store
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
        counts, cost = await self.store.sweep_totals(sweep.id)
        best = await self.store.sweep_best(sweep.id)
        clustered: list[dict[str, Any]] = []
        if counts.get(Phase.FAILED):
            failed = await self.store.sweep_failed(sweep.id, failures.MAX_CELLS)
            clustered = await asyncio.to_thread(failures.clusters, failed, lambda job: (
                self._log_path(job, job.attempts, "stderr")))
            if redact:  # stderr is the owner's to read
                clustered = [{**g, "error": REDACTED, "exemplar_error": REDACTED}
                             for g in clustered]
        doc = report.status(sweep, counts, cost,
                            None if best is None else self.row(sweep, best, redact),
                            clustered)
        return {**doc, "canary_job": await self._canary_job(sweep),
                "estimate": await self.estimate(sweep, cost)}

    async def estimate(self, sweep: SweepRecord, spent: float) -> dict[str, Any]:
        """What every cell should cost and when the last should end (`spent`: what its
        ended attempts cost)."""
        running = sum(self._running_cost(j) for j in await self.store.sweep_running(sweep.id))
        now = time.time()
        return estimate(await self.store.sweep_cell_groups(sweep.id, now), spent, running,
                        self.accounting.gpu_hour_rate, sweep.max_parallel,
                        len(self.accounting.inventory.gpus), now)

    async def _canary_job(self, sweep: SweepRecord) -> str | None:
        """The name of the job that gates the sweep: the smoke command's, or cell 0's."""
        if sweep.spec.canary == "none":
            return None
        smoke = sweep.spec.smoke_job
        jobs = (await self.store.jobs_by_ids([int(smoke)]) if smoke is not None
                else await self.store.sweep_cell_jobs(sweep.id, 0, 1))
        return jobs[0].name if jobs else None
