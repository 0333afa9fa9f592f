"""Uploaded sources: the client sends a tar once (by its sha256); jobs name it with
source={"sha256": ...} and it is unpacked into their workspace before the first attempt."""

from __future__ import annotations

from aiohttp import web

from noduslocal.daemon.api.files import job_workspace
from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.jobs import lookup, require_control
from noduslocal.daemon.api.services import SERVICES
from noduslocal.domain import errors
from noduslocal.domain.jobs import LARGE_SOURCE
from noduslocal.domain.states import TERMINAL
from noduslocal.domain.validation import SHA256_RE

routes = web.RouteTableDef()
ALLOW_LARGE_HEADER = "X-Nodus-Allow-Large"
HARD_LIMIT = 64 * 1024**3  # bytes; even allow_large_source stops here


def source_sha(request: web.Request) -> str:
    sha = request.match_info["sha256"]
    if not SHA256_RE.fullmatch(sha):
        raise errors.InvalidArgument("sha256: expected 64 lowercase hex digits", field="sha256")
    return sha


@routes.get("/v1/sources/{sha256}")
async def get_source(request: web.Request) -> web.Response:
    caller: Caller = request["caller"]
    sha = source_sha(request)
    size = await request.app[SERVICES].resources.touch_source(sha, caller.uid)
    if size is None:
        raise errors.NotFound(f"you have uploaded no source {sha}")
    return web.json_response({"sha256": sha, "size": size})


def _limit(request: web.Request) -> int:
    return HARD_LIMIT if request.headers.get(ALLOW_LARGE_HEADER) == "true" else LARGE_SOURCE


@routes.put("/v1/sources/{sha256}")
async def put_source(request: web.Request) -> web.Response:
    caller: Caller = request["caller"]
    sha = source_sha(request)
    size = await request.app[SERVICES].resources.upload_source(
        sha, caller.owner, request.content.iter_chunked(1 << 20), _limit(request))
    return web.json_response({"sha256": sha, "size": size}, status=201)


@routes.post("/v1/jobs/{name}/snapshot")
async def snapshot_job(request: web.Request) -> web.Response:
    """A finished job's workspace as a source of the caller's (`map --from JOB`), with the
    job's image and runtime for the tasks that start from it."""
    services = request.app[SERVICES]
    caller: Caller = request["caller"]
    job = await lookup(request)
    require_control(request, job, "copy the workspace of")
    if job.phase not in TERMINAL:
        raise errors.Conflict(f"from: job {job.name!r} is {job.phase}; stop it first "
                              f"(noduslocal job cancel {job.name}) so its workspace is final",
                              field="from")
    services.resources.require_upload_room(caller.owner)
    async with job_workspace(request) as (root, _):
        sha, size = await services.resources.snapshot(job, root, caller.owner,
                                                      _limit(request))
    return web.json_response({"sha256": sha, "size": size, "job": job.name,
                              "image": job.spec.image, "runtime": job.spec.runtime},
                             status=201)
