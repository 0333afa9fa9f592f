"""Admins acting on people's work: every user's use against their limits, holding and
releasing a user's queue, and a job's priority (`noduslocal admin users|hold|release|
priority`)."""

from __future__ import annotations

import pwd

from aiohttp import web

from noduslocal.daemon.api.admin import require_admin
from noduslocal.daemon.api.body import read as read_body
from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.jobs import job_response, lookup
from noduslocal.daemon.api.services import SERVICES
from noduslocal.domain import errors

routes = web.RouteTableDef()


def _uid(name: str) -> int:
    if not name or len(name) > 256:
        raise errors.InvalidArgument("user: expected a user name of this host", field="user")
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, ValueError, UnicodeError):  # ValueError: a NUL in the name
        raise errors.NotFound(f"there is no user {name!r} on this host") from None


@routes.get("/v1/admin/users")
async def users(request: web.Request) -> web.Response:
    require_admin(request, "users: you may not see everyone's use and limits")
    return web.json_response({"users": await request.app[SERVICES].admin.user_report()})


@routes.post("/v1/admin/users/{user}/hold")
async def hold_user(request: web.Request) -> web.Response:
    require_admin(request, "hold: you may not hold a user's queue")
    caller: Caller = request["caller"]
    name = request.match_info["user"]
    body = await read_body(request) if request.body_exists else {}
    if not isinstance(body, dict):
        raise errors.InvalidArgument("body: expected a JSON object", field="body")
    reason = body.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > 200):
        raise errors.InvalidArgument("reason: expected words, at most 200 characters",
                                     field="reason")
    await request.app[SERVICES].admin.hold_user(_uid(name), name, caller.name, reason)
    return web.json_response({"user": name, "held": True, "reason": reason})


@routes.post("/v1/admin/users/{user}/release")
async def release_user(request: web.Request) -> web.Response:
    require_admin(request, "release: you may not release a user's queue")
    caller: Caller = request["caller"]
    name = request.match_info["user"]
    await request.app[SERVICES].admin.release_user(_uid(name), name, caller.name)
    return web.json_response({"user": name, "held": False})


@routes.post("/v1/admin/jobs/{name}/priority")
async def priority(request: web.Request) -> web.Response:
    require_admin(request, "priority: only admins may set another priority than the job "
                           "was created with")
    caller: Caller = request["caller"]
    body = await read_body(request)
    value = body.get("priority") if isinstance(body, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or not -1000 <= value <= 1000:
        raise errors.InvalidArgument("priority: expected a whole number from -1000 to 1000",
                                     field="priority")
    job = await lookup(request)
    await request.app[SERVICES].admin.set_priority(job, value, caller.name)
    return job_response(request, await lookup(request))
