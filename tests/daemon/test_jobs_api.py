"""The /v1 jobs API over the real socket: one error shape for bad input and bad query values
with nothing created, an error body that always carries `field`, idempotent creates, list
filters, the wait long poll, logs and the event stream, the estimate, info and the OpenAPI
document."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.testing import wait_until
from tests.conftest import run_cli
from tests.daemon.conftest import job_names


class Raw(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


def raw(d: testing.Daemon, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, Any]:
    conn = Raw(str(d.socket))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data else None
    finally:
        conn.close()


@pytest.mark.parametrize(("body", "status", "code", "field"), [
    (b"{not json", 400, "InvalidArgument", "body"),
    (b"[1, 2]", 400, "InvalidArgument", "body"),
    (b'{"command": ["true"], "colour": "red"}', 400, "InvalidArgument", "colour"),
    (b'{"command": []}', 400, "InvalidArgument", "command"),
    (b'{"command": ["true"], "name": "No_Caps"}', 400, "InvalidArgument", "name"),
    (b'{"command": ["true"], "env": {"9x": "1"}}', 400, "InvalidArgument", "env"),
    (b'{"command": ["true"], "cpu": 64000}', 400, "InvalidArgument", "cpu"),
    (b'{"command": ["true"], "memory": "100TiB"}', 400, "InvalidArgument", "memory"),
    (b'{"command": ["true"], "image": "bad image"}', 400, "InvalidArgument", "image"),
    (b'{"command": ["true"], "network": "host"}', 400, "InvalidArgument", "network"),
])
def test_bad_input_is_one_line_4xx_and_creates_nothing(
        daemon: testing.Daemon, body: bytes, status: int, code: str, field: str) -> None:
    before = job_names(daemon)
    got, payload = raw(daemon, "POST", "/v1/jobs", body, {"Content-Type": "application/json"})
    assert got == status
    assert payload["error"]["code"] == code
    assert payload["error"].get("field") == field
    assert "\n" not in payload["error"]["message"]
    assert job_names(daemon) == before


def test_body_over_one_mib_is_413(daemon: testing.Daemon) -> None:
    before = job_names(daemon)
    big = json.dumps({"command": ["true"], "env": {"X": "y" * (1024 * 1024)}}).encode()
    status, payload = raw(daemon, "POST", "/v1/jobs", big, {"Content-Type": "application/json"})
    assert status == 413
    assert payload["error"]["code"] == "PayloadTooLarge"
    assert job_names(daemon) == before


def test_duplicate_name_is_409_and_keeps_the_first(daemon: testing.Daemon) -> None:
    client = daemon.client()
    before = job_names(daemon)
    first = client.create_job({"name": "same", "command": ["true"]})
    with pytest.raises(errors.AlreadyExists, match="same"):
        client.create_job({"name": "same", "command": ["false"]})
    assert job_names(daemon) == [*before, (first["project"], "same")]
    assert client.get_job("same")["spec"]["command"] == first["spec"]["command"] == ["true"]


def test_idempotency_key_returns_the_same_job(daemon: testing.Daemon) -> None:
    client = daemon.client()
    before = job_names(daemon)
    body = {"command": ["sleep", "5"]}
    one = client.create_job(body, idempotency_key="k-1")
    two = client.create_job(body, idempotency_key="k-1")
    assert one["name"] == two["name"]
    with pytest.raises(errors.Conflict, match="different request"):
        client.create_job({"command": ["sleep", "6"]}, idempotency_key="k-1")
    assert job_names(daemon) == [*before, (one["project"], one["name"])]


def test_unknown_route_and_job_are_404(daemon: testing.Daemon) -> None:
    status, payload = raw(daemon, "GET", "/v1/nothing")
    assert status == 404 and payload["error"]["code"] == "NotFound"
    with pytest.raises(errors.NotFound, match="'ghost' not found in project"):
        daemon.client().get_job("ghost")


def test_generated_names_and_default_project(daemon: testing.Daemon) -> None:
    import getpass

    job = daemon.client().create_job({"command": ["true"]})
    assert job["name"].startswith("job-") and len(job["name"]) == 12
    assert job["project"] == getpass.getuser() == job["owner"]


def test_list_filters(own_daemon: testing.Daemon) -> None:
    client = own_daemon.client()  # its own: the filters are checked against every job
    client.create_job({"name": "a", "command": ["true"], "labels": {"team": "x"}})
    client.create_job({"name": "b", "command": ["sleep", "30"], "labels": {"team": "y"}})
    client.create_job({"name": "c", "project": "other", "command": ["true"]})
    client.wait_job("a", timeout=20)
    assert [j["name"] for j in client.list_jobs(labels={"team": "y"}, all=True)] == ["b"]
    assert [j["name"] for j in client.list_jobs(project="other", all=True)] == ["c"]
    assert "a" not in [j["name"] for j in client.list_jobs()]  # ended jobs need --all
    assert [j["name"] for j in client.list_jobs(phases=["Succeeded"], project="root")] == ["a"]
    with pytest.raises(errors.InvalidArgument, match="phase"):
        client.list_jobs(phases=["Done"])


def test_wait_is_a_server_side_long_poll(daemon: testing.Daemon) -> None:
    client = daemon.client()
    client.create_job({"name": "slow", "command": ["sleep", "1"]})
    # One request that the server holds until the job ends (no client loop in between).
    status, doc = raw(daemon, "GET", "/v1/jobs/slow/wait?timeout=30")
    assert status == 200 and doc["phase"] == "Succeeded"
    client.create_job({"name": "slower", "command": ["sleep", "30"]})
    status, doc = raw(daemon, "GET", "/v1/jobs/slower/wait?timeout=0.2")
    assert status == 200 and doc["phase"] in ("Pending", "Starting", "Running")
    with pytest.raises(errors.WaitTimeout):
        client.wait_job("slower", timeout=0.3)


def test_logs_tail_and_stderr(daemon: testing.Daemon) -> None:
    client = daemon.client()
    client.create_job({"name": "talk", "command": [
        "sh", "-c", "for i in 1 2 3 4 5; do echo out$i; done; echo bad >&2"]})
    client.wait_job("talk", timeout=20)
    full = b"".join(client.logs("talk")).decode()
    assert full == "out1\nout2\nout3\nout4\nout5\nbad\n"
    assert b"".join(client.logs("talk", tail=2)).decode() == "out5\nbad\n"
    assert b"".join(client.logs("talk", stream="stderr")).decode() == "bad\n"
    with pytest.raises(errors.NotFound):
        list(client.logs("talk", attempt=2))


def test_follow_streams_while_running_and_ends_with_the_job(daemon: testing.Daemon) -> None:
    client = daemon.client()
    client.create_job({"name": "ticker", "command": [
        "sh", "-c", "echo one; sleep 0.5; echo two; sleep 0.5; echo three"]})
    seen: list[tuple[float, bytes]] = []
    for chunk in client.logs("ticker", follow=True):
        seen.append((time.monotonic(), chunk))
    text = b"".join(c for _, c in seen).decode()
    assert text == "one\ntwo\nthree\n"
    assert len(seen) >= 2  # delivered as it was written, not at the end in one piece
    assert client.get_job("ticker")["phase"] == "Succeeded"


def test_event_stream_history_and_live(daemon: testing.Daemon) -> None:
    client = daemon.client()
    client.create_job({"name": "ev", "command": ["true"]})
    client.wait_job("ev", timeout=20)
    history = [json.loads(line) for line in b"".join(client.events(job="ev")).splitlines()]
    assert [e["phase"] for e in history] == ["Pending", "Starting", "Running", "Succeeded"]
    assert all(e["job"] == "ev" for e in history)
    seqs = [e["seq"] for e in history]
    assert seqs == sorted(seqs)
    tail = b"".join(client.events(since=seqs[1], job="ev")).splitlines()
    assert [json.loads(x)["phase"] for x in tail] == ["Running", "Succeeded"]

    live: list[dict[str, Any]] = []

    def follow() -> None:
        for chunk in client.events(since=seqs[-1], follow=True):
            for line in chunk.splitlines():
                live.append(json.loads(line))
                if live[-1]["phase"] in ("Succeeded", "Failed"):
                    return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    time.sleep(0.2)
    client.create_job({"name": "ev2", "command": ["false"]})
    reader.join(20)
    assert [e["phase"] for e in live] == ["Pending", "Starting", "Running", "Failed"]
    assert live[-1]["job"] == "ev2" and live[-1]["reason"] == "Error"


def test_info_reports_capacity_and_caller(daemon: testing.Daemon) -> None:
    info = daemon.client().info()
    assert info["capacity"]["cpus"] == 2.0
    assert info["capacity"]["memory"] == 8 * 2**30
    assert info["caller"]["admin"] is True  # root


def test_openapi_document_matches_the_routes(daemon: testing.Daemon) -> None:
    from aiohttp.web import RouteDef

    from noduslocal.daemon.api.app import route_tables

    status, doc = raw(daemon, "GET", "/v1/openapi.json")
    assert status == 200
    documented = {(path, method.upper()) for path, item in doc["paths"].items()
                  for method in item}
    served = {(r.path, r.method) for table in route_tables() for r in table
              if isinstance(r, RouteDef)}
    assert documented == served


def test_bad_query_values_are_a_400(daemon: testing.Daemon) -> None:
    job = daemon.client().create_job({"command": ["true"]})
    daemon.client().wait_job(job["name"], timeout=30)
    for timeout in ("nan", "-5", "inf", "soon"):
        status, reply = raw(daemon, "GET", f"/v1/jobs/{job['name']}/wait?timeout={timeout}")
        assert status == 400 and reply["error"]["field"] == "timeout", (timeout, reply)
    status, reply = raw(daemon, "GET", f"/v1/jobs/{job['name']}/files?path={'a' * 5000}")
    assert status == 400 and reply["error"]["field"] == "path", reply
    status, reply = raw(daemon, "GET", f"/v1/jobs/{job['name']}/files?path={'a' * 300}/b")
    assert status == 400 and "longer than 255" in reply["error"]["message"], reply
    status, _ = raw(daemon, "GET", f"/v1/jobs/{job['name']}/wait?timeout=0")
    assert status == 200


def test_estimate_names_the_job_it_waits_for_and_status_shows_durations(
        daemon: testing.Daemon, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    client = daemon.client()
    blocker = client.create_job({"name": "hog", "cpu": 2,
                                 "command": ["sh", "-c", f"while [ ! -e {gate} ]; do "
                                             "sleep 0.05; done"]})
    wait_until(lambda: client.get_job("hog")["phase"] == "Running", "hog running")
    waiting = nodus.Job.create(name="after", command=["true"], cpu=2, timeout="2h",
                               expected_duration="90s")
    estimate = waiting.estimate()
    assert estimate["start_at"] is None
    assert f"({blocker['project']}/hog)" in estimate["start_basis"], estimate
    shown = run_cli(daemon, "job", "status", "after").stdout
    assert "timeout:    2h00m" in shown and "expected:   1m30s" in shown, shown
    gate.touch()
    assert waiting.wait(timeout=30).phase == "Succeeded"


def test_every_error_body_carries_field(daemon: testing.Daemon) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(daemon.socket))
        sock.sendall(b"GET /v1/jobs/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    body = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "NotFound" and body["error"]["field"] is None, body
