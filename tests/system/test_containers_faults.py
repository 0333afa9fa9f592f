"""Container faults without touching the real dockerd: the daemon reaches dockerd through
a proxy socket that a test cuts and restores (a dropped link, dockerd unreachable), and
the cases a review found: name clashes, a child killed for memory, anonymous volumes."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.domain.states import Phase
from tests.conftest import BUSYBOX, PYTHON_IMAGE

pytestmark = pytest.mark.usefixtures("docker_client")
DOCKER_SOCKET = "/var/run/docker.sock"


class Proxy:
    """A Unix socket that forwards to dockerd's until cut."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conns: list[socket.socket] = []
        self.server: socket.socket | None = None
        self.lock = threading.Lock()

    def up(self) -> None:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(self.path))
        server.listen(256)
        self.server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        self.path.unlink()
        with self.lock:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self.conns.clear()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(DOCKER_SOCKET)
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for end in (a, b):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def proxied() -> Iterator[tuple[testing.Daemon, Proxy]]:
    root = Path(tempfile.mkdtemp(prefix="nl-px-", dir="/tmp"))
    proxy = Proxy(root / "docker.sock")
    proxy.up()
    d = testing.Daemon(cpus=2, memory="8GiB",
                       config=f'docker_host = "unix://{proxy.path}"\nkill_grace = 2\n')
    try:
        d.start()
        with d.as_default():
            yield d, proxy
    finally:
        d.close()
        if proxy.server is not None:
            proxy.server.close()
        shutil.rmtree(root, ignore_errors=True)  # the proxy's socket directory


def test_an_exit_during_a_dropped_link_keeps_its_exit_code(
        proxied: tuple[testing.Daemon, Proxy]) -> None:
    d, proxy = proxied
    created = d.client().create_job({"image": BUSYBOX, "retries": 1,
                                     "command": ["sh", "-c", "sleep 2; echo ran; exit 3"]})
    name = created["name"]
    testing.wait_until(lambda: d.client().get_job(name)["phase"] == Phase.RUNNING, "running")
    proxy.cut()
    time.sleep(4)  # the container exits meanwhile; dockerd itself never went away
    proxy.up()
    final = d.client().wait_job(name, None, timeout=60)
    assert (final["phase"], final["exit_code"], final["attempts"]) == (Phase.FAILED, 3, 1)
    assert "ran" in b"".join(d.client().logs(name)).decode()


def test_a_cancel_while_dockerd_is_unreachable_lands_when_it_is_back(
        proxied: tuple[testing.Daemon, Proxy]) -> None:
    _, proxy = proxied
    job = nodus.Job.run(image=BUSYBOX, command=["sh", "-c", "sleep 30; exit 0"])
    testing.wait_until(lambda: job.status()["phase"] == Phase.RUNNING, "running")
    proxy.cut()
    job.cancel()
    time.sleep(1.5)
    assert job.status()["phase"] == Phase.RUNNING  # due, not delivered
    proxy.up()
    with pytest.raises(errors.JobCancelled):
        job.wait(timeout=30)


def test_dockerd_unreachable_then_back_starts_the_waiting_jobs(
        proxied: tuple[testing.Daemon, Proxy]) -> None:
    d, proxy = proxied
    proxy.cut()
    testing.wait_until(lambda: "dockerd unreachable" in (nodus.Job.run(
        image=BUSYBOX, command=["true"]).status()["hold"] or ""), "a hold", timeout=10)
    proxy.up()
    for job in d.client().list_jobs():
        assert d.client().wait_job(job["name"], None, timeout=60)["phase"] == Phase.SUCCEEDED


def test_jobs_whose_project_and_name_join_alike_do_not_clash(daemon: testing.Daemon) -> None:
    first = nodus.Job.run(project="team-a", name="run", image=BUSYBOX,
                          command=["sh", "-c", "sleep 1"])
    second = nodus.Job.run(project="team", name="a-run", image=BUSYBOX,
                           command=["sh", "-c", "sleep 1"])
    assert first.wait(timeout=60).phase == second.wait(timeout=60).phase == Phase.SUCCEEDED


def test_a_child_killed_for_memory_does_not_fail_a_job_that_exits_0(
        daemon: testing.Daemon) -> None:
    job = nodus.Job.run(image=PYTHON_IMAGE, memory="64MiB", command=["python3", "-c", (
        "import subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-c', 'bytearray(512 * 2**20)'])\n"
        "print('child', r.returncode)\n")])
    assert job.wait(timeout=60).phase == Phase.SUCCEEDED
    assert "child -9" in "\n".join(job.iter_logs())


def test_anonymous_volumes_of_an_image_go_with_its_containers(
        daemon: testing.Daemon, docker_client: Any) -> None:
    image = "noduslocal-test/with-volume:1"
    build = daemon.root / "vol-image"
    build.mkdir()
    (build / "Dockerfile").write_text(f"FROM {BUSYBOX}\nVOLUME /scratch\n")
    docker_client.images.build(path=str(build), tag=image, rm=True)
    try:
        before = {v.id for v in docker_client.volumes.list()}
        jobs = [nodus.Job.run(image=image, command=["sh", "-c", "touch /scratch/x"])
                for _ in range(2)]
        for job in jobs:
            job.wait(timeout=60)
        testing.wait_until(lambda: {v.id for v in docker_client.volumes.list()} <= before,
                           "the anonymous volumes to be removed")
    finally:
        docker_client.images.remove(image, force=True)


def test_a_workdir_in_the_workspace_belongs_to_the_owner(daemon: testing.Daemon) -> None:
    job = nodus.Job.run(image=BUSYBOX, workdir="/workspace/a/b",
                        command=["sh", "-c", "pwd; touch here"])
    job.wait(timeout=60)
    made = next(daemon.data_dir.glob("jobs/*/workspace/a/b"))
    assert made.stat().st_uid == os.getuid() and (made / "here").exists()
