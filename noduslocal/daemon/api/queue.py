"""The queue as the scheduler will take it: pending jobs in order (priority, fair share,
submission), each with why it waits and, for the head, when it is expected to start.
Anyone may read it, like `squeue`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from noduslocal.daemon.api import lanes
from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.jobs import int_query
from noduslocal.daemon.api.lanes import PAGE
from noduslocal.daemon.api.services import SERVICES
from noduslocal.daemon.coordinator import Lifecycle
from noduslocal.domain.timefmt import iso

routes = web.RouteTableDef()


@routes.get("/v1/queue")
async def list_queue(request: web.Request) -> web.Response:
    """The first `limit` places (at most a page, 1,000) and how many wait in all."""
    services = request.app[SERVICES]
    lifecycle = services.lifecycle
    queue = lifecycle.queue
    limit = int_query(request, "limit", PAGE, 1, PAGE) or PAGE
    caller: Caller = request["caller"]
    async with services.lanes.read(caller.uid, caller.name, "queue"):
        # The last pass's order (what the holds describe), not a fresh sort of everything.
        waiting = [r for r in queue.last_order() if r.job_id in queue]
        entries = await lanes.build(enumerate(waiting[:limit]), lambda item: _entry(
            lifecycle, item[0], item[1].job_id))
        body = await lanes.dumps({"kind": "Queue", "total": len(waiting),
                                  "pending": [e for e in entries if e is not None]})
    return web.Response(body=body, content_type="application/json")


def _entry(lifecycle: Lifecycle, place: int, job_id: int) -> dict[str, Any] | None:
    queue = lifecycle.queue
    job = lifecycle.pending_job(job_id)
    if job is None:
        return None
    return {
        "place": place, "name": job.name, "project": job.project, "owner": job.owner,
        "gpu": None if job.spec.gpu is None else job.spec.gpu.to_wire(),
        "cpu": job.spec.cpu_m / 1000, "priority": job.spec.priority,
        "expected_duration": job.spec.expected_duration,
        "hold": queue.wait_reason(job_id), "eta": iso(queue.etas.get(job_id)),
        "created_at": iso(job.created_at)}
