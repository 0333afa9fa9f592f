"""What every tier shares: the CLI as a real process pointed at a daemon, the test images
and docker, and the groups an installed box has. Each tier's own fixtures are in its
conftest.py: tests/unit (none of these), tests/daemon (a daemon shared by a module's
tests), tests/system (a daemon of each test's own, which it may kill)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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


class SlurmCluster:
    """The two-node cluster of scripts/slurm-cluster.sh (n1, n2, two fake GPUs each)."""

    script = REPO / "scripts" / "slurm-cluster.sh"
    config = '[regions.cluster]\nruntime = "slurm"\npartition = "debug"\npoll = 0.5\n'

    def up(self) -> None:
        done = subprocess.run([str(self.script), "up"], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:  # what the script said is why; CalledProcessError hides it
            raise RuntimeError(f"{self.script.name} up exited {done.returncode}:\n"
                               f"{done.stdout}{done.stderr}")

    def restart_controller(self, down_for: float = 0.0, forget: bool = False) -> None:
        """slurmctld stopped (SIGTERM: it saves its state), away for DOWN_FOR seconds, and
        started again; returns once it answers. FORGET: started with -c, which drops every
        job it held (a controller whose state was lost)."""
        subprocess.run(["pkill", "-TERM", "-x", "slurmctld"], check=False)
        deadline = time.monotonic() + 30
        while subprocess.run(["pgrep", "-x", "slurmctld"], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "slurmctld did not stop"
            time.sleep(0.1)
        time.sleep(down_for)
        if forget:
            subprocess.run(["slurmctld", "-c", "-i"], check=True, timeout=60)
        self.up()

    def queue(self) -> list[list[str]]:
        """Every job in squeue: [id, state, reason, comment]."""
        out = subprocess.run(["squeue", "-h", "-o", "%i|%T|%r|%k"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
        return [line.split("|", 3) for line in out.splitlines()]


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """The test cluster, started if it is not running (scripts/test.sh starts it). Missing:
    the test fails under CI, else is skipped."""
    cluster = SlurmCluster()
    status = subprocess.run([str(cluster.script), "status"], capture_output=True)
    if status.returncode != 0:
        try:
            if os.getuid() != 0:
                raise RuntimeError("starting it needs root")
            cluster.up()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            message = f"a Slurm cluster is needed ({exc}); scripts/slurm-cluster.sh up starts one"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
    return cluster


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

