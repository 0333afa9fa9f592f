"""Issue 13, item 6: `noduslocal events [--follow] [--json]` streams the event log, and the
daemon's own log is structured: each job's phase change one line naming the job, requests
at debug level naming the user, syslog priorities for journald under systemd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from noduslocal import testing
from noduslocal.domain.sockets import SOCKET_ENV
from tests.conftest import run_cli


@pytest.fixture
def chatty(monkeypatch: pytest.MonkeyPatch) -> Iterator[testing.Daemon]:
    monkeypatch.setenv("JOURNAL_STREAM", "8:4242")  # as systemd sets it: journald reads us
    d = testing.Daemon(cpus=2, memory="2GiB", log_level="DEBUG")
    try:
        yield d.start()
    finally:
        d.close()


def test_events_lists_and_follows(daemon: testing.Daemon) -> None:
    client = daemon.client()
    client.wait_job(client.create_job({"name": "first", "command": ["true"]})["name"])
    lines = run_cli(daemon, "events").stdout.splitlines()
    assert [line.split()[3] for line in lines] == ["Pending", "Starting", "Running",
                                                    "Succeeded"]
    assert all(" root/first " in line for line in lines)
    docs = [json.loads(line) for line in run_cli(daemon, "events", "--json").stdout.splitlines()]
    assert [d["seq"] for d in docs] == sorted(d["seq"] for d in docs)
    assert run_cli(daemon, "events", "--since", str(docs[-2]["seq"]), "--json").stdout \
        .count("\n") == 1
    follower = subprocess.Popen(
        [sys.executable, "-m", "noduslocal.cli", "events", "--follow", "--json", "--since",
         str(docs[-1]["seq"])], stdout=subprocess.PIPE, text=True,
        env={**os.environ, SOCKET_ENV: str(daemon.socket)})
    try:
        client.create_job({"name": "second", "command": ["true"]})
        seen = []
        assert follower.stdout is not None
        while not seen or seen[-1]["phase"] != "Succeeded":
            seen.append(json.loads(follower.stdout.readline()))
        assert {e["job"] for e in seen} == {"second"}
    finally:
        follower.terminate()
        follower.wait(timeout=10)
    assert run_cli(daemon, "events", "--job", "second").stdout.count("\n") == 4


def test_the_daemon_log_names_jobs_and_users(chatty: testing.Daemon) -> None:
    d = chatty
    client = d.client()
    client.wait_job(client.create_job({"name": "told", "command": ["true"]})["name"])
    run_cli(d, "job", "list")
    deadline = time.monotonic() + 10
    while "Succeeded" not in d.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = d.log().splitlines()
    assert "<6>INFO noduslocal.jobs: Succeeded (Completed) job=root/told" in lines
    requests = [line for line in lines if " request " in f"{line} " and "route=/v1/jobs " in line]
    assert requests and requests[0].startswith(
        "<7>DEBUG noduslocal.daemon.api.app: request user=root method=")
    assert all(line.startswith("<") for line in lines if line and not line.startswith(" "))
