"""A sweep's report: each cell's row (GPU, region, parameters, phase, cost, wall time) in
index order, and the sweep's status (phase, counts per phase, total cost).
"""

from __future__ import annotations

import time
from typing import Any

from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.sweeps import SweepRecord


def cell_row(sweep: SweepRecord, job: JobRecord, region: str, running_cost: float,
             live_metrics: dict[str, float] | None, redact: bool) -> dict[str, Any]:
    assert job.cell is not None
    metrics = live_metrics or job.metrics
    params = sweep.spec.params(job.cell)
    end = job.ended_at or (time.time() if job.started_at else None)
    return {
        "index": job.cell,
        "name": job.name,
        "gpu": job.spec.gpu.describe() if job.spec.gpu is not None else None,
        "region": params.get("region", region),
        "params": dict.fromkeys(params, "***") if redact else params,
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


def status(sweep: SweepRecord, counts: dict[str, int], cost: float,
           best: dict[str, Any] | None, failures: list[dict[str, Any]]) -> dict[str, Any]:
    """`best`: the row of the succeeded cell with the highest throughput (lower cost on a
    tie), None until one reported it; `failures`: failed cells clustered by error."""
    done = sum(counts.get(p, 0) for p in ("Succeeded", "Failed", "Cancelled"))
    return {**sweep.to_wire(), "counts": counts, "done": done, "cost": round(cost, 6),
            "best": best, "failures": failures}
