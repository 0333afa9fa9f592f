"""The aiohttp application: the error middleware that gives every failure one shape, the
identity middleware, and the route table of /v1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from noduslocal.daemon.api import (
    admin,
    admin_users,
    files,
    gpus,
    identity,
    jobs,
    outputs,
    prometheus,
    queue,
    retention,
    secrets,
    sources,
    streams,
    sweeps,
    system,
    volumes,
)
from noduslocal.daemon.api.prometheus import METRICS, Metrics
from noduslocal.daemon.api.services import SERVICES, STREAM, Services
from noduslocal.domain import errors

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
    except ConnectionError:  # the client left mid-stream (Ctrl-C on logs -f): not an error
        log.debug("%s %s: the client went away", request.method, request.path)
        stream = request.get(STREAM)
        # Nobody reads what is returned; aiohttp only finishes the exchange with it.
        return stream if stream is not None else web.Response(status=499)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(errors.Internal("internal error; see the daemon's log"))


def _watch_body(request: web.Request, timeout: float) -> None:
    """Close the connection of a request whose body stopped arriving: a client that sends
    headers and then a trickle would otherwise hold a handler and a descriptor for ever."""
    content = request.content
    loop = asyncio.get_running_loop()
    seen = content.total_bytes

    def check() -> None:
        nonlocal seen
        if content.is_eof() or request.transport is None:
            return
        if content.total_bytes == seen:
            log.info("closing a %s %s whose body sent nothing for %gs", request.method,
                     request.path, timeout)
            request.transport.close()
            return
        seen = content.total_bytes
        loop.call_later(timeout, check)

    loop.call_later(timeout, check)


@web.middleware
async def body_deadline_middleware(request: web.Request,
                                   handler: Handler) -> web.StreamResponse:
    # Most bodies arrive with their headers: no timer for those.
    if request.body_exists and not request.content.is_eof():
        _watch_body(request, request.app[SERVICES].settings.body_timeout)
    return await handler(request)


@web.middleware
async def encoding_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bodies come uncompressed: aiohttp would inflate gzip or deflate as the handler reads,
    a bomb past max_body's meaning, and a body that fails to inflate fails mid-handler."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return await handler(request)
    response = error_response(errors.InvalidArgument(
        f"Content-Encoding: {encoding[:40]!r} is not accepted; send the body uncompressed "
        "(Content-Encoding: identity, or none)", field="Content-Encoding"))
    # Answered, then the connection closed at once: aiohttp would otherwise read the rest
    # of the body after the answer, inflating it (and logging a body that fails to).
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


@web.middleware
async def identity_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    services = request.app[SERVICES]
    request["caller"] = identity.peer(request, services.settings.admin_group)
    return await handler(request)


@web.middleware
async def request_log_middleware(request: web.Request,
                                 handler: Handler) -> web.StreamResponse:
    """Each request at debug level, with who asked: `--log-level DEBUG` to see them."""
    if not log.isEnabledFor(logging.DEBUG):
        return await handler(request)
    start = time.perf_counter()
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except errors.NodusError as exc:  # answered by the error middleware, outside this one
        status = exc.http_status
        raise
    finally:
        resource = request.match_info.route.resource
        log.debug("request", extra={
            "user": request["caller"].name, "method": request.method,
            "route": resource.canonical if resource is not None else request.path,
            "status": status, "ms": f"{(time.perf_counter() - start) * 1000:.1f}"})


def route_tables() -> list[web.RouteTableDef]:
    return [system.routes, jobs.routes, streams.routes, files.routes, outputs.routes,
            secrets.routes, volumes.routes, sources.routes, gpus.routes, queue.routes,
            sweeps.routes, admin.routes, admin_users.routes, prometheus.routes,
            retention.routes]


def build_app(services: Services, metrics: Metrics | None = None) -> web.Application:
    metrics = metrics or Metrics(services)
    app = web.Application(client_max_size=services.settings.max_body,
                          middlewares=[metrics.middleware, error_middleware,
                                       encoding_middleware, body_deadline_middleware,
                                       identity_middleware,
                                       request_log_middleware])
    app[SERVICES] = services
    app[METRICS] = metrics
    for table in route_tables():
        app.add_routes(table)
    return app
