"""What every tier shares: the CLI as a real process pointed at a daemon, the test images
and docker, and the groups an installed box has. Each tier's own fixtures are in its
conftest.py: tests/unit (none of these), tests/daemon (a daemon shared by a module's
tests), tests/system (a daemon of each test's own, which it may kill)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from noduslocal import testing
from noduslocal.domain.sockets import SOCKET_ENV

REPO = Path(__file__).resolve().parent.parent
Cli = Callable[..., subprocess.CompletedProcess[str]]


def run_cli(d: testing.Daemon, *args: str, input: str | None = None,
            timeout: float = 60, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`noduslocal ARGS...` as a separate process against daemon `d` (in CWD: `map`
    uploads its working directory)."""
    full_env = {**os.environ, SOCKET_ENV: str(d.socket), **(env or {})}
    return subprocess.run([sys.executable, "-m", "noduslocal.cli", *args], input=input,
                          capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=cwd)


@pytest.fixture
def cli(daemon: testing.Daemon) -> Cli:
    """The CLI against the test's `daemon` (whichever the tier's conftest gives)."""
    def call(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return run_cli(daemon, *args, **kwargs)  # type: ignore[arg-type]

    return call


BUSYBOX = "noduslocal-test/busybox:1"
PYTHON_IMAGE = "noduslocal-test/python:3.11"


@pytest.fixture(scope="session")
def docker_client():  # type: ignore[no-untyped-def]
    """docker-py against the local engine with the test images built
    (scripts/build-test-images.sh). Missing: the test fails under CI, else is skipped."""
    import docker

    try:
        client = docker.from_env(timeout=60)
        client.ping()
        for image in (BUSYBOX, PYTHON_IMAGE):
            client.images.get(image)
    except Exception as exc:
        message = (f"docker is needed ({type(exc).__name__}: {exc}); scripts/test.sh starts "
                   "dockerd and builds the test images")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return client


@pytest.fixture
def lab_groups() -> Iterator[None]:
    """The groups scripts/install.sh makes (noduslocal, noduslocal-admin), as on an installed
    box, for tests whose `doctor` must find them; removed again if this made them."""
    if os.getuid() != 0:
        pytest.skip("making the groups needs root")
    made = []
    for group in ("noduslocal", "noduslocal-admin"):
        if subprocess.run(["getent", "group", group], capture_output=True).returncode != 0:
            subprocess.run(["groupadd", group], check=True)
            made.append(group)
    try:
        yield
    finally:
        for group in made:
            subprocess.run(["groupdel", group], check=False)

