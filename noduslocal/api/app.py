"""The aiohttp application: the error middleware that gives every failure one shape, the
identity middleware, and the route table of /v1.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from noduslocal import errors
from noduslocal.api import (
    admin,
    estimate,
    files,
    gpus,
    identity,
    jobs,
    outputs,
    queue,
    secrets,
    sources,
    streams,
    sweeps,
    system,
    volumes,
)
from noduslocal.api.services import SERVICES, Services

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(exc: errors.NodusError) -> web.Response:
    return web.json_response(exc.to_wire(), status=exc.http_status)


def _from_http(exc: web.HTTPException, max_body: int) -> errors.NodusError:
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return errors.PayloadTooLarge(f"body: larger than the limit of {max_body} bytes",
                                      field="body")
    if isinstance(exc, web.HTTPNotFound):
        return errors.NotFound("no such API route")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return errors.InvalidArgument(f"method {exc.method} is not allowed here")
    return errors.InvalidArgument(exc.reason or f"HTTP {exc.status}")


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.NodusError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(_from_http(exc, request.app[SERVICES].settings.max_body))
    except json.JSONDecodeError as exc:
        return error_response(errors.InvalidArgument(f"body: not valid JSON ({exc.msg})",
                                                     field="body"))
    except (ConnectionResetError, ConnectionError):
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(errors.Internal("internal error; see the daemon's log"))


@web.middleware
async def identity_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    services = request.app[SERVICES]
    request["caller"] = identity.peer(request, services.settings.admin_group)
    return await handler(request)


def route_tables() -> list[web.RouteTableDef]:
    return [system.routes, jobs.routes, streams.routes, files.routes, outputs.routes,
            secrets.routes, volumes.routes, sources.routes, gpus.routes, queue.routes,
            estimate.routes, sweeps.routes, admin.routes]


def build_app(services: Services) -> web.Application:
    app = web.Application(client_max_size=services.settings.max_body,
                          middlewares=[error_middleware, identity_middleware])
    app[SERVICES] = services
    for table in route_tables():
        app.add_routes(table)
    return app
