"""Daemon-level resources: health, the doctor's checks, what this daemon is (version,
capacity, who you are) and the profiles it offers."""

from __future__ import annotations

import json
import os
from importlib import resources

from aiohttp import web

from noduslocal import __version__
from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.services import SERVICES

routes = web.RouteTableDef()


@routes.get("/v1/health")
async def health(request: web.Request) -> web.Response:
    """200 while the daemon serves; `ok` false and `status` degraded, with each problem in
    words, while it cannot take new work or record what happens, or after the database
    lost commits it had acknowledged."""
    problems = request.app[SERVICES].admin.problems()
    return web.json_response({"ok": not problems,
                              "status": "degraded" if problems else "ok",
                              "problems": problems})


@routes.get("/v1/doctor")
async def doctor(request: web.Request) -> web.Response:
    """What the daemon can see of what it needs, one check each, OK or what to do: its
    runtimes (dockerd and the NVIDIA container runtime, the host jobs' shim), its GPUs (NVML
    and the driver), the data dir's disk, its config, and its clock against the database.
    Anyone may read it; `noduslocal doctor` adds what only the caller's side can see."""
    checks = await request.app[SERVICES].admin.doctor()
    return web.json_response({"checks": [c.to_wire() for c in checks]})


@routes.get("/v1/info")
async def info(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    settings = services.settings
    admin = services.admin
    caller: Caller = request["caller"]
    return web.json_response({
        "version": __version__,
        "pid": os.getpid(),
        "socket": str(settings.socket),
        "data_dir": str(settings.data_dir),
        "region": settings.region,
        "user_mode": settings.user_mode,
        "started_at": services.started_at,
        "capacity": admin.capacity(),
        "queue": admin.counts(),
        "groups": {"users": settings.socket_group, "admins": settings.admin_group},
        "caller": {"uid": caller.uid, "gid": caller.gid, "name": caller.name,
                   "admin": caller.admin},
        "config": admin.config_status(),
        # Job directories the database did not know at start: each one for admins, how
        # many and the caller's own for everyone.
        "orphans": admin.orphans() if caller.admin else [],
        "lost_jobs": admin.lost_view(caller.uid, caller.admin),
    })


@routes.get("/v1/me")
async def me(request: web.Request) -> web.Response:
    """The caller's own use and limits: jobs running and waiting, GPUs held, fair-share
    GPU-hours, the limits that apply (the row an admin sees in `admin users`)."""
    caller: Caller = request["caller"]
    row = await request.app[SERVICES].admin.own_report(caller.uid, caller.name)
    return web.json_response({"kind": "Me", **row})


@routes.get("/v1/regions")
async def regions(request: web.Request) -> web.Response:
    """Where jobs may run: this box, then each configured cluster region with its
    partitions, nodes and GPUs by type (total, used, free), as Slurm says now. Anyone may
    read it."""
    return web.json_response({"regions": await request.app[SERVICES].admin.regions()})


@routes.get("/v1/profiles")
async def profiles(request: web.Request) -> web.Response:
    """The daemon's presets of Job.create arguments, by name (anyone may read them)."""
    return web.json_response({"profiles": request.app[SERVICES].settings.profiles})


@routes.get("/v1/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    text = resources.files("noduslocal.daemon.api").joinpath("openapi.json").read_text()
    return web.json_response(json.loads(text))
