"""`Job.estimate()`: when a job should start (a simulation of the queue), what it should
cost (p50/p90, from its expected_duration, else from the owner's earlier runs of the same
image and command), and why it waits now.
"""

from __future__ import annotations

import json
import time

from aiohttp import web

from noduslocal.daemon.api.jobs import lookup
from noduslocal.daemon.api.services import SERVICES
from noduslocal.daemon.scheduler.capacity import Request
from noduslocal.daemon.scheduler.estimate import estimate_start
from noduslocal.daemon.scheduler.gang_estimate import gang_topology
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.states import Phase
from noduslocal.domain.timefmt import iso

routes = web.RouteTableDef()


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@routes.get("/v1/jobs/{name}/estimate")
async def estimate(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    lifecycle = services.lifecycle
    job: JobRecord = await lookup(request)
    now = time.time()
    if job.phase == Phase.PENDING:
        start = estimate_start(lifecycle.queue, job.id, now, lifecycle.job_label)
        start_at, start_why = start.at, start.why
    elif job.phase in (Phase.STARTING, Phase.RUNNING):
        start_at, start_why = job.started_at or now, "it started"
    else:  # Suspended (until resumed) or ended: it has no start ahead
        start_at, start_why = None, f"it is {job.phase}"
    spec = job.spec
    gpus = spec.gpu.count if spec.gpu else 0
    rate = lifecycle.gpu_hour_rate(spec.gpu.model if spec.gpu else None)
    costs: list[float] = []
    source = "no expected_duration and no earlier run of the same command"
    if spec.expected_duration is not None:
        costs = [gpus * spec.expected_duration / 3600 * rate]
        source = "expected_duration x the GPU-hour rate"
    else:
        same = []
        for stored, seconds, cost in await services.store.past_runs(job.owner_uid):
            other = json.loads(stored)
            if (other.get("command") == spec.command and other.get("args") == spec.args
                    and other.get("image") == spec.image):
                same.append(cost or gpus * seconds / 3600 * rate)
        if same:
            costs, source = same, f"{len(same)} earlier runs of the same image and command"
    gang = None
    if spec.gang is not None:
        gang = gang_topology(lifecycle.queue.capacity.gpus, Request.of(job.id, spec, job.owner_uid),
                             spec.gang.nodes, spec.gang.gpus_per_node,
                             lifecycle.wait_reason(job.id) if job.phase == Phase.PENDING else None)
    return web.json_response({
        "kind": "Estimate", "name": job.name, "phase": job.phase, "gang": gang,
        "start_at": iso(start_at), "start_in_s": None if start_at is None
        else round(max(0.0, start_at - now), 1), "start_basis": start_why,
        "cost_p50": round(_pct(costs, 50), 6) if costs else None,
        "cost_p90": round(_pct(costs, 90), 6) if costs else None, "cost_basis": source,
        "hold": lifecycle.wait_reason(job.id)})
