"""GET /v1/doctor: what the daemon can see of what it needs, one check each, OK or what to
do: its runtimes (dockerd and the NVIDIA container runtime, the host jobs' shim), its GPUs
(NVML and the driver), the data dir's disk, its config, and its clock against the database.
Anyone may read it; `noduslocal doctor` adds what only the caller's side can see.
"""

from __future__ import annotations

from aiohttp import web

from noduslocal.daemon.api.services import SERVICES

routes = web.RouteTableDef()


@routes.get("/v1/doctor")
async def doctor(request: web.Request) -> web.Response:
    checks = await request.app[SERVICES].admin.doctor()
    return web.json_response({"checks": [c.to_wire() for c in checks]})
