"""Issue 28, item 1: `noduslocal job exec -it` driven through a real pseudo-terminal
(pty.fork) against a real daemon: the window's size and its changes reach the command,
Ctrl-C interrupts what runs in it without touching the job, its exit status is the CLI's,
the local terminal is restored; for a host job, a container and rank 1 of a gang. And the
SDK's Job.exec(pty=True) as a process."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.domain.sockets import SOCKET_ENV

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 60.0
PROMPT = r"[$#] "  # sh's, for a user and for root


@pytest.fixture(scope="module")
def daemon() -> Iterator[testing.Daemon]:
    with testing.daemon(cpus=4, memory="8GiB") as d:
        yield d


class Session:
    """`noduslocal job exec -it ARGS` on a pseudo-terminal of our own."""

    def __init__(self, socket: Path, *args: str, rows: int = 30, cols: int = 100) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the CLI, as a user would run it in a terminal
            os.environ[SOCKET_ENV] = str(socket)
            os.execv(sys.executable, [sys.executable, "-m", "noduslocal.cli", "job", "exec",
                                      "-it", *args])
        self.pid, self.fd = pid, fd
        self.resize(rows, cols)
        self.seen = b""

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        with_group = os.tcgetpgrp(self.fd) if self._alive() else None
        if with_group:
            os.killpg(with_group, signal.SIGWINCH)

    def _alive(self) -> bool:
        try:
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, pattern: str, timeout: float = DEADLINE) -> re.Match[bytes]:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern.encode())
        while True:
            if found := regex.search(self.seen):
                self.seen = self.seen[found.end():]
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"never saw {pattern!r}; saw {self.seen[-2000:]!r}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.fd, 65536)
                except OSError:  # EIO: the CLI has exited
                    raise AssertionError(f"the CLI ended before {pattern!r}; saw "
                                         f"{self.seen[-2000:]!r}") from None

    def exit_code(self) -> int:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            with_status = os.waitpid(self.pid, os.WNOHANG)
            if with_status[0]:
                return os.waitstatus_to_exitcode(with_status[1])
            with_data = select.select([self.fd], [], [], 0.1)[0]
            if with_data:
                with contextlib.suppress(OSError):
                    self.seen += os.read(self.fd, 65536)
        raise AssertionError("the CLI did not exit")


def running(job: nodus.Job) -> None:
    testing.wait_until(lambda: job.status().phase == "Running", f"{job.name} never ran")


def drive(session: Session) -> None:
    """The checks every kind of job gets: size, resize, Ctrl-C, exit status."""
    session.expect(PROMPT)
    session.send("stty size\r")
    session.expect(r"30 100")
    session.resize(40, 132)
    session.send("stty size\r")  # at once: the keys must not overtake the resize
    assert session.expect(r"(\d+ \d+)\r?\n").group(1) == b"40 132"
    session.send("sleep 300\r")
    time.sleep(1)
    session.send("\x03")  # Ctrl-C: the terminal's interrupt, to the sleep, not the job
    session.expect(PROMPT)
    session.send("echo status-$?\r")
    session.expect(r"status-130")
    session.send("exit 7\r")
    assert session.exit_code() == 7


def test_a_shell_in_a_host_job(daemon: testing.Daemon) -> None:
    with daemon.as_default():
        job = nodus.Job.create(name="tty-host", command=["sleep", "300"])
        try:
            running(job)
            session = Session(daemon.socket, "tty-host", "--", "sh", "-i")
            drive(session)
            assert job.status().phase == "Running"  # Ctrl-C reached the exec alone
        finally:
            job.cancel()


def test_keys_typed_right_after_a_resize_see_the_new_size(daemon: testing.Daemon) -> None:
    """The CLI's keys go out on a thread of their own and its resize from the SIGWINCH
    handler: a command typed at once after a resize ran at the old size (CI, once). Each
    key sent now follows the window's size, so no retry is needed here."""
    with daemon.as_default():
        job = nodus.Job.create(name="tty-sizes", command=["sleep", "300"])
        try:
            running(job)
            session = Session(daemon.socket, "tty-sizes", "--", "sh", "-i")
            session.expect(PROMPT)
            for rows, cols in [(31, 101), (45, 140), (12, 60), (50, 200), (24, 80)] * 4:
                session.resize(rows, cols)
                session.send("stty size\r")
                seen = session.expect(r"(\d+ \d+)\r?\n").group(1)
                assert seen == f"{rows} {cols}".encode(), (rows, cols, seen)
            session.send("exit 0\r")
            assert session.exit_code() == 0
        finally:
            job.cancel()


def test_the_local_terminal_is_restored(daemon: testing.Daemon) -> None:
    """The CLI sets its terminal raw for the session and back to its mode after."""
    with daemon.as_default():
        job = nodus.Job.create(name="tty-restore", command=["sleep", "300"])
        try:
            running(job)
            pid, fd = pty.fork()
            if pid == 0:
                os.environ[SOCKET_ENV] = str(daemon.socket)
                code = os.system(f"{sys.executable} -m noduslocal.cli job exec -it tty-restore"
                                 f" -- sh -c 'exit 3'; stty -a")
                os._exit(os.waitstatus_to_exitcode(code) if code >= 0 else 1)
            text = testing.pty_output(pid, fd)
            assert " icanon" in text and " echo" in text and "-icanon" not in text, text
        finally:
            job.cancel()


def test_a_shell_in_a_container(daemon: testing.Daemon, docker_client: Any) -> None:
    del docker_client
    with daemon.as_default():
        job = nodus.Job.create(name="tty-box", image="noduslocal-test/busybox:1",
                               command=["sleep", "300"])
        try:
            running(job)
            drive(Session(daemon.socket, "tty-box", "--", "sh", "-i"))
            assert job.status().phase == "Running"
        finally:
            job.cancel()


def test_a_shell_beside_rank_1_of_a_gang(daemon: testing.Daemon) -> None:
    with daemon.as_default():
        job = nodus.Job.create(name="tty-gang", command=["sleep", "300"],
                               distributed={"nodes": 2})
        try:
            running(job)
            session = Session(daemon.socket, "tty-gang", "--rank", "1", "--", "sh", "-i")
            session.expect(PROMPT)
            session.send("echo rank=$RANK\r")
            session.expect(r"rank=1")
            session.send("exit 0\r")
            assert session.exit_code() == 0
        finally:
            job.cancel()


def test_the_sdk_s_pty_process(daemon: testing.Daemon) -> None:
    with daemon.as_default():
        job = nodus.Job.create(name="tty-sdk", command=["sleep", "300"])
        try:
            running(job)
            with job.exec("sh", "-i", pty=True) as proc:
                proc.stdout.read_until(b"# " if os.getuid() == 0 else b"$ ", timeout=DEADLINE)
                proc.resize(33, 77)
                proc.stdin.write("stty size; exit 5\r")
                out = proc.stdout.read(timeout=DEADLINE)
                assert b"33 77" in out, out
                assert proc.wait(DEADLINE) == 5
            with pytest.raises(errors.InvalidArgument):
                job.exec("sh", pty=True, rank=3)  # the daemon's refusal, before any terminal
        finally:
            job.cancel()


def test_it_counts_among_the_owner_s_execs_and_ends_with_the_job(
        daemon: testing.Daemon) -> None:
    with daemon.as_default():
        job = nodus.Job.create(name="tty-end", command=["sleep", "300"])
        running(job)
        proc = job.exec("sh", "-i", pty=True)
        proc.stdout.read_until(b"# " if os.getuid() == 0 else b"$ ", timeout=DEADLINE)
        job.cancel()  # the job ends: its terminal ends with it (killed in its cgroups,
        assert proc.wait(DEADLINE) in (129, 137)  # or closed by the daemon: 129)
        proc.close()
