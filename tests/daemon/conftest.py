"""The daemon tier: a real noduslocald, shared by the tests of a module (`daemon`) where they
do not interfere. Such tests give their jobs, sweeps, volumes and secrets names no other test
of the module uses, and say "created nothing" as "the daemon holds what it held before".
Whatever a test leaves running is cancelled after it (`settle`), so the next test finds the
daemon's CPUs free. A test that needs a clean or differently configured daemon takes
`own_daemon`, or starts one with `testing.daemon(config=...)`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from noduslocal import testing
from noduslocal.domain import errors

SETTLE = 60.0  # seconds for a shared daemon's leftovers to end; they end at once unless stuck


def settle(d: testing.Daemon) -> None:
    """Cancel every sweep and job of `d` that has not ended, and wait until none is left."""
    client = d.client()
    for sweep in client.list_sweeps(running=True):
        with contextlib.suppress(errors.Conflict, errors.NotFound):
            client.cancel_sweep(sweep["name"], sweep["project"])
    for job in client.list_jobs():
        with contextlib.suppress(errors.Conflict, errors.NotFound):
            client.cancel_job(job["name"], job["project"])
    try:
        testing.wait_until(
            lambda: not client.list_jobs() and not client.list_sweeps(running=True),
            "the jobs and sweeps a test left to end", SETTLE)
    except AssertionError as exc:  # what was left, and what the daemon said last
        left = [f"job {j['name']} {j['phase']} ({j.get('reason')})" for j in client.list_jobs()]
        left += [f"sweep {s['name']} {s['phase']}" for s in client.list_sweeps(running=True)]
        tail = "\n".join(d.log().splitlines()[-40:])
        raise AssertionError(f"{exc}: {', '.join(left)}\n{tail}\n{d.state_dump()}") from None


def job_names(d: testing.Daemon) -> list[tuple[str, str]]:
    """(project, name) of every job the daemon holds, ended ones too."""
    return [(j["project"], j["name"]) for j in d.client().list_jobs(all=True)]


def sweep_names(d: testing.Daemon) -> list[tuple[str, str]]:
    return [(s["project"], s["name"]) for s in d.client().list_sweeps(all=True)]


@pytest.fixture(scope="module")
def shared_daemon() -> Iterator[testing.Daemon]:
    """The module's daemon: 2 CPUs, 8 GiB. A module that needs another one overrides this."""
    with testing.daemon(cpus=2, memory="8GiB") as d:
        yield d


@pytest.fixture
def daemon(shared_daemon: testing.Daemon) -> Iterator[testing.Daemon]:
    """The module's shared daemon, which the SDK and the CLI use for the test; what the test
    left running is cancelled after it."""
    with shared_daemon.as_default():
        yield shared_daemon
    settle(shared_daemon)


@pytest.fixture
def own_daemon() -> Iterator[testing.Daemon]:
    """A daemon of the test's own (2 CPUs, 8 GiB), for a test that looks at everything a
    daemon holds or changes what the daemon does for everyone."""
    with testing.daemon(cpus=2, memory="8GiB") as d:
        yield d


@pytest.fixture
def own_cli(own_daemon: testing.Daemon) -> Any:
    """The CLI against `own_daemon`."""
    from tests.conftest import run_cli

    def call(*args: str, **kwargs: object) -> Any:
        return run_cli(own_daemon, *args, **kwargs)  # type: ignore[arg-type]

    return call
