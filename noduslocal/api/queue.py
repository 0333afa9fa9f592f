"""The queue as the scheduler will take it: pending jobs in order (priority, fair share,
submission), each with why it waits and, for the head, when it is expected to start.
Anyone may read it, like `squeue`.
"""

from __future__ import annotations

from aiohttp import web

from noduslocal.api.services import SERVICES
from noduslocal.timefmt import iso

routes = web.RouteTableDef()


@routes.get("/v1/queue")
async def list_queue(request: web.Request) -> web.Response:
    lifecycle = request.app[SERVICES].lifecycle
    queue = lifecycle.queue
    entries = []
    # The last pass's order (what the holds describe), not a fresh sort of everything.
    for place, req in enumerate(r for r in queue.last_order() if r.job_id in queue):
        job = lifecycle.pending_job(req.job_id)
        if job is None:
            continue
        entries.append({
            "place": place, "name": job.name, "project": job.project, "owner": job.owner,
            "gpu": None if job.spec.gpu is None else job.spec.gpu.to_wire(),
            "cpu": job.spec.cpu_m / 1000, "priority": job.spec.priority,
            "expected_duration": job.spec.expected_duration,
            "hold": queue.hold(req.job_id), "eta": iso(queue.etas.get(req.job_id)),
            "created_at": iso(job.created_at)})
    return web.json_response({"kind": "Queue", "pending": entries})
