"""Issue 11, item 7: profiles, named presets of Job.create arguments in the daemon's config
that fill what a job left unset; an unknown one is refused naming those there are, and a
bad one stops the daemon at start naming it. A real daemon, the SDK and the CLI.
"""

from __future__ import annotations

import json

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from tests.conftest import run_cli

CONFIG = """
[profiles.small]
cpu = "500m"
memory = "1GiB"
timeout = "10m"
env = { STAGE = "small" }
labels = { tier = "small" }

[profiles.a100-train]
cpu = 2
retries = 2
"""


@pytest.fixture(scope="module")
def d() -> testing.Daemon:
    daemon = testing.Daemon(cpus=2, memory="4GiB", config=CONFIG)
    daemon.start()
    yield daemon  # type: ignore[misc]
    daemon.close()


def test_a_profile_fills_what_the_job_left_unset(d: testing.Daemon) -> None:
    with d.as_default():
        job = nodus.Job.create(name="p1", command=["sh", "-c", "echo $STAGE"],
                               profile="small", memory="2GiB")
        job.wait(timeout=30)
    doc = d.client().get_job("p1")
    spec = doc["spec"]
    assert (spec["cpu"], spec["memory"], spec["timeout"]) == (0.5, 2 * 2**30, 600)
    assert spec["profile"] == "small" and doc["labels"] == {"tier": "small"}
    assert b"".join(d.client().logs("p1")).decode().strip() == "small"


def test_the_cli_takes_a_profile_and_shows_it(d: testing.Daemon) -> None:
    made = run_cli(d, "job", "run", "--detach", "--name", "p2", "--profile", "a100-train",
                   "--", "true")
    assert made.returncode == 0, made.stderr
    spec = d.client().get_job("p2")["spec"]
    assert (spec["cpu"], spec["retries"]) == (2, 2)
    shown = run_cli(d, "job", "status", "p2")
    assert "profile:" in shown.stdout and "a100-train" in shown.stdout
    listed = run_cli(d, "profiles", "--json")
    assert json.loads(listed.stdout)["small"]["cpu"] == "500m"
    assert "a100-train: cpu=2, retries=2" in run_cli(d, "profiles").stdout


def test_an_unknown_profile_is_refused_naming_those_there_are(d: testing.Daemon) -> None:
    with pytest.raises(errors.InvalidArgument, match="there are: a100-train, small") as info:
        d.client().create_job({"name": "p3", "command": ["true"], "profile": "huge"})
    assert info.value.field == "profile"
    with pytest.raises(errors.NotFound):
        d.client().get_job("p3")
    refused = run_cli(d, "job", "run", "--profile", "huge", "--", "true")
    assert refused.returncode == 2 and "there are: a100-train, small" in refused.stderr


def test_a_sweep_template_takes_a_profile(d: testing.Daemon) -> None:
    d.client().create_sweep({"name": "ps", "template": {"command": ["true"],
                                                        "profile": "small"},
                             "grid": {"LR": ["1", "2"]}})
    testing.wait_until(lambda: d.client().transport.request(
        "GET", "/v1/sweeps/ps")["phase"] == "Succeeded", "the sweep ends")
    assert d.client().get_job("ps-1")["spec"]["cpu"] == 0.5


