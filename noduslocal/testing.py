"""Start a real noduslocald in a temporary directory, for our tests and for yours.

    with noduslocal.testing.daemon(cpus=2) as d:
        job = nodus.Job.run(command=["true"])   # the SDK talks to this daemon
        job.wait()

The daemon is a separate process on a short socket path; `kill()` and `start()` again
test what a crash does. On exit every job process it started is killed and the directory
removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from noduslocal.daemon.runtime.host.shim import start_ticks
from noduslocal.domain import errors
from noduslocal.domain.sockets import SOCKET_ENV
from noduslocal.sdk.api_client import ApiClient

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], what: str, timeout: float = 30.0) -> T:
    """Poll `predicate` until it returns something true and return that; fail with
    `what` in the message after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


def process_gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


class Daemon:
    def __init__(self, root: Path | None = None, *, cpus: float | str | None = None,
                 memory: str | None = None, config: str | None = None,
                 log_level: str = "INFO") -> None:
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="nl-", dir="/tmp"))
        os.chmod(self.root, 0o711)  # other local users may reach the socket, not list files
        self.socket = self.root / "api.sock"
        self.data_dir = self.root / "data"
        self.log_path = self.root / "daemon.log"
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = self.root / "config.toml"
            self.config_path.write_text(config)
        self.cpus = cpus
        self.memory = memory
        self.log_level = log_level
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "noduslocal.daemon.main", "--socket", str(self.socket),
                "--data-dir", str(self.data_dir), "--log-level", self.log_level]
        if self.cpus is not None:
            argv += ["--cpus", str(self.cpus)]
        if self.memory is not None:
            argv += ["--memory", str(self.memory)]
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        return argv

    def start(self, timeout: float = 15.0) -> Daemon:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"noduslocald exited with {self.proc.returncode}:\n"
                                   f"{self.log()}")
            try:
                client.transport.request("GET", "/v1/health", timeout=2)
                return self
            except errors.DaemonUnavailable:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"noduslocald did not answer within {timeout}s:\n"
                                       f"{self.log()}") from None
                time.sleep(0.02)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, as systemd would; returns the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        """kill -9: the crash the daemon must survive."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def restart(self) -> Daemon:
        self.kill()
        return self.start()

    def client(self) -> ApiClient:
        return ApiClient(self.socket)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @contextlib.contextmanager
    def as_default(self) -> Iterator[Daemon]:
        """Point the SDK and the CLI (NODUSLOCAL_SOCKET) at this daemon for a while."""
        old = os.environ.get(SOCKET_ENV)
        os.environ[SOCKET_ENV] = str(self.socket)
        try:
            yield self
        finally:
            if old is None:
                os.environ.pop(SOCKET_ENV, None)
            else:
                os.environ[SOCKET_ENV] = old

    def kill_jobs(self) -> None:
        """SIGKILL every process group a shim of this daemon started (every gang rank's)."""
        for pid_file in [*self.data_dir.glob("jobs/*/attempt-*/pid.json"),
                         *self.data_dir.glob("jobs/*/attempt-*/rank-*/pid.json"),
                         *self.data_dir.glob("jobs/*/attempt-*/index-*/pid.json")]:
            try:
                pid = json.loads(pid_file.read_text())
                # Only a group whose leader is still that job: never a reused id.
                if start_ticks(pid["pgid"]) == pid["start_ticks"]:
                    os.killpg(pid["pgid"], signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass

    def remove_containers(self) -> None:
        """Force-remove every docker container this daemon created (none without docker)."""
        from noduslocal.daemon.runtime.docker.spec import instance_id, job_filter

        try:
            import docker

            client = docker.from_env(timeout=30)
            for container in client.containers.list(
                    all=True, filters=job_filter(instance_id(self.data_dir))):
                with contextlib.suppress(Exception):
                    container.remove(force=True)
            client.close()
        except Exception:  # no docker engine: nothing to remove
            pass

    def close(self) -> None:
        if self.proc is not None:
            self.kill()
        self.kill_jobs()
        self.remove_containers()
        try:
            shutil.rmtree(self.root, ignore_errors=True)
        except RecursionError:  # a job left a tree deeper than Python's stack
            subprocess.run(["rm", "-rf", "--", str(self.root)], check=False)


@contextlib.contextmanager
def daemon(**kwargs: object) -> Iterator[Daemon]:
    """A started daemon that the SDK and CLI use until the block ends."""
    instance = Daemon(**kwargs)  # type: ignore[arg-type]
    try:
        instance.start()
        with instance.as_default():
            yield instance
    finally:
        instance.close()
