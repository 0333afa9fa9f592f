"""The dashboard's guard and pages without a daemon: the one-time token for a cookie, the
Host check, CSRF on POST, the headers on every answer (a stream's too), and a user's text
escaped wherever a page shows it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from noduslocal.dashboard import pages
from noduslocal.dashboard.guard import CSRF_HEADER, Guard


async def _hello(request: web.Request) -> web.StreamResponse:
    if request.query.get("stream"):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"data: x\n\n")
        return resp
    return web.Response(text=f"hello {request['session'].csrf[:4]}")


async def _client() -> tuple[TestClient[Any, Any], Guard]:
    guard = Guard()
    app = web.Application(middlewares=[guard.middleware])
    app.on_response_prepare.append(guard.on_prepare)
    app.router.add_get("/", _hello)
    app.router.add_get("/jobs", _hello)
    app.router.add_post("/jobs/p/n/cancel", _hello)
    server = TestServer(app, host="127.0.0.1")
    client = TestClient(server)
    await client.start_server()
    guard.port = server.port or 0
    return client, guard


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_the_token_works_once_and_leaves_a_strict_cookie() -> None:
    async def go() -> None:
        client, guard = await _client()
        try:
            token = guard.login_url().split("token=", 1)[1]
            assert (await client.get("/jobs")).status == 403
            signed = await client.get(f"/jobs?token={token}&phase=Running",
                                      allow_redirects=False)
            assert signed.status == 303
            assert signed.headers["Location"] == "/jobs?phase=Running"  # token gone
            cookie = signed.headers["Set-Cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
            assert (await client.get("/jobs")).status == 200  # the cookie jar holds it
            client.session.cookie_jar.clear()
            again = await client.get(f"/jobs?token={token}", allow_redirects=False)
            assert again.status == 403  # once only
            with pytest.raises(AssertionError):
                guard.login_url()
        finally:
            await client.close()

    run(go())


def test_a_wrong_token_or_host_is_refused() -> None:
    async def go() -> None:
        client, guard = await _client()
        try:
            assert (await client.get("/?token=nope")).status == 403
            token = guard.login_url().split("token=", 1)[1]
            rebound = await client.get(f"/?token={token}",
                                       headers={"Host": f"attacker.example:{guard.port}"})
            assert rebound.status == 403  # and the token is still unused
            assert (await client.get(f"/?token={token}")).status == 200
            for host in (f"attacker.example:{guard.port}", "127.0.0.1",
                         f"localhost:{guard.port + 1}"):
                assert (await client.get("/jobs", headers={"Host": host})).status == 403
            assert (await client.get("/jobs",
                                     headers={"Host": f"localhost:{guard.port}"})).status == 200
        finally:
            await client.close()

    run(go())


def test_post_needs_the_session_s_csrf_token_and_no_foreign_origin() -> None:
    async def go() -> None:
        client, guard = await _client()
        try:
            token = guard.login_url().split("token=", 1)[1]
            await client.get(f"/?token={token}")
            session = next(iter(guard._sessions.values()))
            assert (await client.post("/jobs/p/n/cancel")).status == 403
            assert (await client.post("/jobs/p/n/cancel",
                                      headers={CSRF_HEADER: "wrong"})).status == 403
            assert (await client.post("/jobs/p/n/cancel", headers={
                CSRF_HEADER: session.csrf, "Origin": "http://evil.example"})).status == 403
            ok = await client.post("/jobs/p/n/cancel", headers={
                CSRF_HEADER: session.csrf, "Origin": f"http://127.0.0.1:{guard.port}"})
            assert ok.status == 200
            assert (await client.put("/jobs/p/n/cancel", headers={
                CSRF_HEADER: session.csrf})).status in (403, 405)
        finally:
            await client.close()

    run(go())


def test_every_answer_carries_the_security_headers_a_stream_too() -> None:
    async def go() -> None:
        client, guard = await _client()
        try:
            token = guard.login_url().split("token=", 1)[1]
            for path in (f"/?token={token}", "/jobs", "/jobs?stream=1", "/nothing"):
                resp = await client.get(path, allow_redirects=False)
                assert "default-src 'none'" in resp.headers["Content-Security-Policy"], path
                assert resp.headers["X-Content-Type-Options"] == "nosniff", path
                assert resp.headers["Cache-Control"] == "no-store", path
            refused = await client.get("/jobs", headers={"Host": "x.example"})
            assert refused.headers["X-Frame-Options"] == "DENY"
        finally:
            await client.close()

    run(go())


EVIL = '<script>alert(1)</script>"\''


def test_a_user_s_text_is_escaped_on_every_page() -> None:
    job = {"name": "j", "project": "p", "owner": EVIL, "uid": 1, "phase": "Failed",
           "reason": EVIL, "message": EVIL, "hold": EVIL, "labels": {EVIL: EVIL},
           "metrics": {EVIL: 1}, "created_at": None,
           "spec": {"command": [EVIL], "args": [EVIL], "cpu": 1, "gpu": {"model": EVIL}}}
    sweep = {"name": "s", "project": "p", "owner": EVIL, "phase": "Failed", "cells": 1,
             "done": 1, "counts": {EVIL: 1}, "best": {"metric": EVIL},
             "failures": [{"count": 1, "exit_code": 1, "error": EVIL,
                           "exemplar_job": "s-0"}]}
    cells = [{"index": 0, "name": "s-0", "phase": EVIL, "params": {EVIL: EVIL},
              "metrics": {"m": EVIL}}]
    rendered = [
        pages.jobs_table([job], {("p", "j"): {"hold": EVIL, "eta": EVIL}}, "submit", None,
                         {"user": EVIL}),
        pages.jobs_filters({"user": EVIL, "label": EVIL}),
        pages.job_summary(job, {"why": EVIL}),
        pages.attempts_table([{"number": 1, "message": EVIL, "gpus": [EVIL]}]),
        pages.timeline([{"phase": EVIL, "message": EVIL}]),
        pages.sweep_summary(sweep, {"s-0": EVIL}),
        pages.cells_table(sweep, cells),
        pages.sweeps_table([sweep]),
        pages.outputs_list(job, [{"name": EVIL, "path": EVIL, "collected": False,
                                  "skipped": EVIL}]),
        pages.files_list(job, EVIL, [{"name": EVIL, "type": "file", "path": EVIL}]),
        pages.gpus_table({"note": EVIL, "gpus": [{"index": 0, "name": EVIL, "healthy": False,
                                                  "problem": EVIL, "processes": [
                                                      {"pid": 1, "name": EVIL}]}]}),
        pages.queue_table({"pending": [{"name": "j", "project": "p", "owner": EVIL,
                                        "hold": EVIL}]}),
        pages.layout(EVIL, "jobs", "", EVIL, {"name": EVIL}),
        pages.status_page(403, EVIL),
    ]
    for html in rendered:
        assert "<script>alert" not in html, html
        assert '"\'' not in html.replace('"{', "")  # quotes escaped in attributes too
