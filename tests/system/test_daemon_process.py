"""The daemon as a process: one per socket and per data directory, stale sockets, a clean
SIGTERM that leaves jobs running for the next daemon to adopt, sd_notify, permissions of
the socket and the data it keeps, and what the CLI says when no daemon runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.domain.sockets import SOCKET_ENV
from noduslocal.sdk.api_client import ApiClient
from noduslocal.testing import process_gone as gone
from noduslocal.testing import wait_until

T = TypeVar("T")
DEADLINE = 30.0
IS_ROOT = os.getuid() == 0




@pytest.fixture
def fresh() -> Iterator[testing.Daemon]:
    """A daemon that the test starts (and stops, kills, restarts) itself."""
    d = testing.Daemon(cpus=2)
    try:
        yield d
    finally:
        d.close()


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def healthy(c: ApiClient) -> bool:
    try:
        c.transport.request("GET", "/v1/health", timeout=5)
    except errors.DaemonUnavailable:
        return False
    return True


def run_daemon(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "noduslocal.daemon.main", *argv],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)




def job_pid(d: testing.Daemon, name: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for path in d.data_dir.glob("jobs/*/attempt-*/pid.json"):
            try:
                data = json.loads(path.read_text())
                environ = Path(f"/proc/{data['pid']}/environ").read_bytes()
            except (OSError, ValueError):
                continue
            if f"NODUS_JOB={name}".encode() in environ.split(b"\0"):
                return data
        return None

    return wait_until(find, f"the pid of {name}")


# --- one daemon per socket and per data directory -----------------------------------------


def test_second_daemon_on_same_socket_refuses(daemon: testing.Daemon, tmp_path: Path) -> None:
    result = run_daemon("--socket", str(daemon.socket), "--data-dir", str(tmp_path / "data"))
    assert result.returncode != 0
    assert "already" in result.stderr, result.stderr
    assert str(daemon.socket) in result.stderr
    # The first daemon is untouched and still serves on its socket.
    assert stat.S_ISSOCK(os.lstat(daemon.socket).st_mode)
    assert healthy(daemon.client())


def test_second_daemon_on_same_data_dir_refuses(daemon: testing.Daemon,
                                                tmp_path: Path) -> None:
    other = tmp_path / "other.sock"
    result = run_daemon("--socket", str(other), "--data-dir", str(daemon.data_dir))
    assert result.returncode != 0
    assert str(daemon.data_dir) in result.stderr, result.stderr
    assert not other.exists(), "the refused daemon left a socket behind"
    c = daemon.client()
    assert healthy(c)
    job = c.create_job({"command": ["true"]})
    assert c.wait_job(job["name"], timeout=DEADLINE)["phase"] == "Succeeded"


def test_stale_plain_file_at_socket_path_is_replaced(fresh: testing.Daemon) -> None:
    fresh.socket.write_text("left over\n")
    fresh.start()
    assert stat.S_ISSOCK(os.lstat(fresh.socket).st_mode)
    assert healthy(fresh.client())


def test_dead_socket_left_by_kill9_is_replaced(fresh: testing.Daemon) -> None:
    fresh.start()
    fresh.kill()
    assert stat.S_ISSOCK(os.lstat(fresh.socket).st_mode), "kill -9 leaves its socket"
    assert not healthy(fresh.client())
    fresh.start()
    c = fresh.client()
    job = c.create_job({"command": ["true"]})
    assert c.wait_job(job["name"], timeout=DEADLINE)["phase"] == "Succeeded"


# --- SIGTERM ------------------------------------------------------------------------------


def test_sigterm_exits_cleanly_and_jobs_run_on_to_be_adopted(fresh: testing.Daemon) -> None:
    fresh.start()
    c = fresh.client()
    c.create_job({"name": "long", "command": ["sleep", "30"]})
    wait_until(lambda: c.get_job("long")["phase"] == "Running", "long to run")
    pid = job_pid(fresh, "long")

    # Open streams must not hold the shutdown up: a follower of the events and a long poll.
    def hold(stream: Callable[[], object]) -> None:
        with contextlib.suppress(Exception):
            stream()

    holders = [
        threading.Thread(target=hold, daemon=True,
                         args=(lambda: list(ApiClient(fresh.socket).events(follow=True)),)),
        threading.Thread(target=hold, daemon=True, args=(
            lambda: ApiClient(fresh.socket).transport.request(
                "GET", "/v1/jobs/long/wait", query={"timeout": "60"}, timeout=90),)),
    ]
    for thread in holders:
        thread.start()
    time.sleep(0.3)  # let both requests reach the daemon

    assert fresh.stop(timeout=5) == 0  # TimeoutExpired here: it did not exit within 5 s
    assert not gone(pid["pid"]) and not gone(pid["shim_pid"]), "the job died with the daemon"
    assert not fresh.socket.exists(), "a clean stop removes its socket"
    for thread in holders:
        thread.join(10)
        assert not thread.is_alive(), "a stream stayed open after the daemon exited"

    fresh.start()
    job = c.get_job("long")
    assert (job["phase"], job["attempts"]) == ("Running", 1), job
    assert [a["phase"] for a in c.attempts("long")] == ["Running"]
    c.cancel_job("long")
    job = c.wait_job("long", timeout=DEADLINE)
    assert (job["phase"], job["signal"]) == ("Cancelled", 15), job
    assert gone(pid["pid"])


# --- sd_notify ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_sd_notify_ready_and_stopping(fresh: testing.Daemon, kind: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if kind == "path":
        address = str(fresh.root / "notify.sock")
        listener.bind(address)
    else:
        address = f"@noduslocal-test-{os.getpid()}-{time.monotonic_ns()}"
        listener.bind("\0" + address[1:])
    listener.settimeout(DEADLINE)
    try:
        with open(fresh.log_path, "ab") as log:
            fresh.proc = subprocess.Popen(fresh.command(), stdout=log, stderr=log,
                                          stdin=subprocess.DEVNULL,
                                          env={**os.environ, "NOTIFY_SOCKET": address})
        said = [listener.recv(4096).decode() for _ in range(3)]
        assert said[:2] == ["STATUS=opening the database",
                            "STATUS=recovering: adopting the jobs that ran on while no "
                            "daemon was up"]
        assert said[2] == f"READY=1\nSTATUS=serving on {fresh.socket}"
        # Ready means ready: the API answers at once, no retrying.
        assert fresh.client().transport.request("GET", "/v1/health", timeout=5) is not None
        assert fresh.stop(timeout=10) == 0
        assert listener.recv(4096) == b"STOPPING=1\nSTATUS=stopping; the jobs run on"
    finally:
        listener.close()


# --- permissions --------------------------------------------------------------------------


@pytest.mark.skipif(not IS_ROOT, reason="the system daemon's 0660 socket needs root")
def test_socket_mode_as_root(daemon: testing.Daemon) -> None:
    assert mode(daemon.socket) == 0o660
    assert os.lstat(daemon.socket).st_uid == 0


@pytest.mark.skipif(IS_ROOT, reason="user mode (socket 0600) is what a non-root daemon "
                                    "runs in; as root the daemon is the system daemon")
def test_socket_mode_as_user(daemon: testing.Daemon) -> None:
    assert mode(daemon.socket) == 0o600


@pytest.mark.skipif(not IS_ROOT, reason="the system data dir is 0711 only as root")
def test_data_dir_and_db_modes_as_root(daemon: testing.Daemon) -> None:
    assert mode(daemon.data_dir) == 0o711
    assert mode(daemon.data_dir / "noduslocal.db") == 0o600
    assert mode(daemon.data_dir / "daemon.lock") == 0o600


@pytest.mark.skipif(IS_ROOT, reason="a user daemon's data dir is 0700; as root it is 0711")
def test_data_dir_and_db_modes_as_user(daemon: testing.Daemon) -> None:
    assert mode(daemon.data_dir) == 0o700
    assert mode(daemon.data_dir / "noduslocal.db") == 0o600


def test_db_wal_and_shm_are_private_on_first_start(daemon: testing.Daemon) -> None:
    c = daemon.client()
    job = c.create_job({"command": ["true"], "env": {"SOME_TOKEN": "do-not-leak"}})
    c.wait_job(job["name"], timeout=DEADLINE)
    companions = [daemon.data_dir / f"noduslocal.db{suffix}" for suffix in ("-wal", "-shm")]
    present = [p for p in companions if p.exists()]
    assert present, "the daemon keeps its WAL open while it runs"
    # The data dir is 0711, so anyone who knows these names can open them.
    assert {p.name: oct(mode(p)) for p in present} == {p.name: "0o600" for p in present}


# --- the CLI without a daemon -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "stale"])
def test_cli_without_daemon_prints_one_line(tmp_path: Path, kind: str) -> None:
    if kind == "missing":
        path = tmp_path / "nonexistent" / "x.sock"
    else:
        path = tmp_path / "x.sock"
        path.write_text("")  # nothing listens here
    env = {**os.environ, SOCKET_ENV: str(path)}
    result = subprocess.run([sys.executable, "-m", "noduslocal.cli", "job", "list"],
                            capture_output=True, text=True, timeout=60, env=env,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0]
    assert "noduslocal daemon" in lines[0]


@pytest.mark.skipif(not IS_ROOT, reason="the path check guards a root daemon")
def test_root_daemon_refuses_a_data_dir_others_can_swap(tmp_path: Path) -> None:
    """A root daemon's shims write into the data dir as root: a directory on the way that
    another user may write to (without the sticky bit) would let them redirect that."""
    open_dir = Path(tempfile.mkdtemp(prefix="nl-open-", dir="/tmp"))
    try:
        os.chmod(open_dir, 0o777)
        d = testing.Daemon()
        argv = [*d.command()]
        argv[argv.index("--data-dir") + 1] = str(open_dir / "data")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert done.returncode == 1
        assert "not safe for a root daemon" in done.stderr
        assert len([x for x in done.stderr.splitlines() if "ERROR" in x]) == 1
        d.close()
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)


def test_relative_paths_are_made_absolute(tmp_path: Path) -> None:
    d = testing.Daemon()
    try:
        argv = [*d.command()]
        argv[argv.index("--data-dir") + 1] = "data-rel"
        # What close() cleans up after (the daemon's cgroups are named for its data dir:
        # one set was left on the box by every run of this test).
        d.data_dir = d.root / "data-rel"
        with open(d.log_path, "ab") as log:
            d.proc = subprocess.Popen(argv, cwd=d.root, stdout=log, stderr=log)
        wait_until(lambda: d.socket.exists(), "the daemon to listen")
        info = d.client().info()
        assert info["data_dir"] == str(d.root / "data-rel")
    finally:
        d.close()
