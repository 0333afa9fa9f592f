"""The caller's secrets: set, list (names and dates only) and remove. Values go in and
never come out of the API; jobs receive them as environment variables."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from noduslocal.daemon.api.body import read as read_body
from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.services import SERVICES
from noduslocal.domain import errors
from noduslocal.domain.timefmt import iso
from noduslocal.domain.validation import ENV_KEY_RE, validate_secret_value

routes = web.RouteTableDef()


def secret_name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not ENV_KEY_RE.fullmatch(name) or len(name) > 128:
        raise errors.InvalidArgument(
            f"name: {name!r} is not a secret name; use letters, digits and '_', not "
            "starting with a digit (it is also the variable a job gets)", field="name")
    return name


@routes.get("/v1/secrets")
async def list_secrets(request: web.Request) -> web.Response:
    caller: Caller = request["caller"]
    rows = await request.app[SERVICES].resources.secrets(caller.uid)
    return web.json_response({"secrets": [
        {"name": name, "created_at": iso(created), "updated_at": iso(updated)}
        for name, created, updated in rows]})


@routes.put("/v1/secrets/{name}")
async def set_secret(request: web.Request) -> web.Response:
    caller: Caller = request["caller"]
    name = secret_name(request)
    body: Any = await read_body(request)
    if not isinstance(body, dict) or set(body) != {"value"}:
        raise errors.InvalidArgument('body: expected {"value": "..."}', field="body")
    value = validate_secret_value(body["value"], "value")
    created = await request.app[SERVICES].resources.set_secret(caller.uid, name, value)
    return web.json_response({"name": name, "created": created}, status=201 if created else 200)


@routes.delete("/v1/secrets/{name}")
async def delete_secret(request: web.Request) -> web.Response:
    caller: Caller = request["caller"]
    name = secret_name(request)
    await request.app[SERVICES].resources.delete_secret(caller.uid, name)
    return web.json_response({"name": name, "deleted": True})
