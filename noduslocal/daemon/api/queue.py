"""The queue as the scheduler will take it: pending jobs in order (priority, fair share,
submission), each with why it waits and, for the head, when it is expected to start.
Anyone may read it, like `squeue`.
"""

from __future__ import annotations

from aiohttp import web

from noduslocal.daemon.api import lanes
from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.jobs import int_query
from noduslocal.daemon.api.lanes import PAGE
from noduslocal.daemon.api.services import SERVICES

routes = web.RouteTableDef()


@routes.get("/v1/queue")
async def list_queue(request: web.Request) -> web.Response:
    """The first `limit` places (at most a page, 1,000) and how many wait in all."""
    services = request.app[SERVICES]
    limit = int_query(request, "limit", PAGE, 1, PAGE) or PAGE
    caller: Caller = request["caller"]
    async with services.lanes.read(caller.uid, caller.name, "queue"):
        total, entries = services.jobs.queue_page(limit)
        body = await lanes.dumps({"kind": "Queue", "total": total, "pending": entries})
    return web.Response(body=body, content_type="application/json")

