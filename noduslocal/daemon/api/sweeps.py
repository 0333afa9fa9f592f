"""Sweep resources: create (one call for every cell), list, status, the cells' report,
wait (a server-side long poll), cancel, a live max_parallel, and removing an ended one."""

from __future__ import annotations

import hashlib
from typing import Any

from aiohttp import web

from noduslocal.daemon.api import lanes
from noduslocal.daemon.api.body import parse as parse_body
from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.jobs import (
    check_project,
    idempotency_key,
    int_query,
    poll_timeout,
    project_of,
)
from noduslocal.daemon.api.lanes import PAGE
from noduslocal.daemon.api.services import SERVICES
from noduslocal.daemon.sweeps.service import SweepAction
from noduslocal.domain import errors
from noduslocal.domain.sweep_plan import MAX_PARALLEL, parse_sweep
from noduslocal.domain.sweeps import SweepRecord
from noduslocal.domain.validation import SQL_INT_MAX

routes = web.RouteTableDef()
CELLS_PAGE = PAGE  # cells in one answer at most; ?offset= pages on
SWEEPS_PAGE = 100  # sweeps in one answer at most (each a status document)


async def lookup(request: web.Request) -> SweepRecord:
    caller: Caller = request["caller"]
    return await request.app[SERVICES].sweeps.find(
        project_of(request), request.match_info["name"], caller.uid,
        implicit="project" not in request.query)


def require_control(request: web.Request, sweep: SweepRecord, action: str) -> None:
    caller: Caller = request["caller"]
    caller.require_control(f"sweep {sweep.name!r}", sweep.owner_uid, sweep.owner, action)


def redact(request: web.Request, sweep: SweepRecord) -> bool:
    caller: Caller = request["caller"]
    return not caller.may_control(sweep.owner_uid)


async def status_doc(request: web.Request, sweep: SweepRecord) -> dict[str, Any]:
    return await request.app[SERVICES].sweeps.document(sweep, redact(request, sweep))


async def sweep_response(request: web.Request, sweep: SweepRecord,
                         status: int = 200) -> web.Response:
    return web.json_response(await status_doc(request, sweep), status=status)


async def _control(request: web.Request, verb: str, action: SweepAction) -> web.Response:
    """An owner's (or admin's) action on a sweep; answers with the sweep as it is after."""
    sweep = await lookup(request)
    require_control(request, sweep, verb)
    return await sweep_response(request, await request.app[SERVICES].sweeps.control(
        sweep, action))


@routes.post("/v1/sweeps")
async def create_sweep(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    caller: Caller = request["caller"]
    raw = await request.read()
    plan = parse_sweep(parse_body(raw), regions=services.settings.region_names,
                       profiles=services.settings.profiles)
    check_project(caller, plan.project)
    key = idempotency_key(request)
    digest = hashlib.sha256(raw).hexdigest() if key is not None else None
    sweep, created = await services.sweeps.create(plan, caller.owner, key, digest)
    return await sweep_response(request, sweep, 201 if created else 200)


@routes.get("/v1/sweeps")
async def list_sweeps(request: web.Request) -> web.Response:
    """The newest sweeps that match, ended ones too unless `running`, a page at a time
    (`next`: the cursor for `before`). `all` is accepted, as before every sweep was
    listed."""
    services = request.app[SERVICES]
    caller: Caller = request["caller"]
    project = request.query.get("project")
    limit = int_query(request, "limit", SWEEPS_PAGE, 1, SWEEPS_PAGE) or SWEEPS_PAGE
    before = int_query(request, "before", None, 1, SQL_INT_MAX)
    async with services.lanes.read(caller.uid, caller.name, "sweep list"):
        sweeps = await services.sweeps.list(
            project=None if project is None else project_of(request),
            active_only=request.query.get("running") in ("1", "true"),
            limit=limit + 1, before=before)
        more = len(sweeps) > limit
        page = sweeps[1:] if more else sweeps
        docs = await services.sweeps.documents(page, [redact(request, s) for s in page])
        body = await lanes.dumps({"sweeps": docs, "next": str(page[0].id) if more else None})
    return web.Response(body=body, content_type="application/json")


@routes.get("/v1/sweeps/{name}")
async def get_sweep(request: web.Request) -> web.Response:
    return web.json_response(await status_doc(request, await lookup(request)))


@routes.get("/v1/sweeps/{name}/cells")
async def sweep_cells(request: web.Request) -> web.Response:
    """A page of the sweep's cells in index order (`next`: the offset that goes on)."""
    services = request.app[SERVICES]
    caller: Caller = request["caller"]
    sweep = await lookup(request)
    offset = int_query(request, "offset", 0, 0, SQL_INT_MAX) or 0
    limit = int_query(request, "limit", CELLS_PAGE, 1, CELLS_PAGE) or CELLS_PAGE
    async with services.lanes.read(caller.uid, caller.name, "sweep cells"):
        cells = await services.sweeps.cells(sweep, offset, limit + 1, redact(request, sweep))
        more = len(cells) > limit
        body = await lanes.dumps({"cells": cells[:limit],
                                  "next": offset + limit if more else None})
    return web.Response(body=body, content_type="application/json")


@routes.get("/v1/sweeps/{name}/wait")
async def wait_sweep(request: web.Request) -> web.Response:
    timeout = poll_timeout(request)
    sweep = await lookup(request)
    return await sweep_response(request, await request.app[SERVICES].sweeps.wait(sweep, timeout))


@routes.post("/v1/sweeps/{name}/cancel")
async def cancel_sweep(request: web.Request) -> web.Response:
    remaining = request.query.get("remaining") in ("1", "true")
    return await _control(request, "cancel", "cancel-remaining" if remaining else "cancel")


@routes.post("/v1/sweeps/{name}/suspend")
async def suspend_sweep(request: web.Request) -> web.Response:
    """Release no more cells and stop the running ones, each kept Suspended."""
    return await _control(request, "suspend", "suspend")


@routes.post("/v1/sweeps/{name}/resume")
async def resume_sweep(request: web.Request) -> web.Response:
    """Go on where the suspend left it: the suspended cells wait again, in order."""
    return await _control(request, "resume", "resume")


@routes.post("/v1/sweeps/{name}/retry")
async def retry_sweep(request: web.Request) -> web.Response:
    """Run a Failed sweep's failed cells again as new jobs (`all`: cancelled ones too);
    after a canary failure the canary first."""
    include = request.query.get("all") in ("1", "true")
    return await _control(request, "retry", "retry-all" if include else "retry")


@routes.post("/v1/sweeps/{name}/gc")
async def gc_sweep(request: web.Request) -> web.Response:
    """Free the workspaces of a finished sweep's jobs; their history, logs and cost stay."""
    sweep = await lookup(request)
    require_control(request, sweep, "gc")
    return await sweep_response(request, await request.app[SERVICES].sweeps.free(sweep))


@routes.delete("/v1/sweeps/{name}")
async def remove_sweep(request: web.Request) -> web.Response:
    """An ended sweep out of listings, its name free for a new sweep; its jobs are removed
    as `job rm` removes one, their history and cost kept (owner or admin)."""
    sweep = await lookup(request)
    require_control(request, sweep, "remove")
    caller: Caller = request["caller"]
    await request.app[SERVICES].sweeps.remove(sweep, caller.name)
    return web.json_response({"removed": sweep.name, "project": sweep.project})


@routes.post("/v1/sweeps/{name}/set")
async def set_sweep(request: web.Request) -> web.Response:
    sweep = await lookup(request)
    require_control(request, sweep, "change")
    body: Any = parse_body(await request.read())
    if not isinstance(body, dict) or set(body) != {"max_parallel"}:
        raise errors.InvalidArgument('body: expected {"max_parallel": N}', field="body")
    value = body["max_parallel"]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARALLEL:
        raise errors.InvalidArgument(f"max_parallel: expected an integer from 1 to "
                                     f"{MAX_PARALLEL}", field="max_parallel")
    return await sweep_response(request, await request.app[SERVICES].sweeps.set_max_parallel(
        sweep, value))
