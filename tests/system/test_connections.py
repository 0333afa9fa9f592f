"""Issue 10, item 2: one user's idle and half-sent connections must not take the daemon's
descriptors from everybody else. Real daemons with a lowered descriptor limit, a second uid
holding raw sockets from Debian's python3, and the CLI as a real process.
"""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from noduslocal import testing
from noduslocal.daemon.logfmt import RepeatLimit
from noduslocal.domain import errors
from noduslocal.sdk.transport import Transport
from noduslocal.sdk.wire import _connect_through_a_full_queue
from tests.conftest import run_cli

# Beside the other system tests (scripts/test.sh): its own daemons, each with descriptor
# limits of its own.
pytestmark = pytest.mark.beside

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

# Opens N connections to SOCKET, each with a request's first line and no end of headers,
# reads what each gets back until EXPECT are left unanswered, prints
# {"refused": {status: n}, "held": n}, then holds those until its stdin closes.
HOLDER = r'''
import json, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
held, refused = [], {}
for _ in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    try:
        for _ in range(500):  # as the real client does, wait out a full listen queue
            try:
                s.connect(path)
                break
            except BlockingIOError:
                time.sleep(0.01)
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
    except OSError as exc:
        refused[type(exc).__name__] = refused.get(type(exc).__name__, 0) + 1
        s.close()
        continue
    held.append(s)
# Answers come as the daemon works through the burst: read until only `expect` are left
# unanswered (or a deadline passes).
expect, deadline, still = int(sys.argv[3]), time.monotonic() + 30, held
while True:
    time.sleep(0.2)
    pending = []
    for s in still:
        s.setblocking(False)
        try:
            data = s.recv(4096)
        except BlockingIOError:
            pending.append(s)
            continue
        key = data.split(b" ")[1].decode() if data else "closed"
        if data:
            refused.setdefault("body", data.split(b"\r\n\r\n", 1)[1].decode())
        refused[key] = refused.get(key, 0) + 1
    still = pending
    if len(still) <= expect or time.monotonic() > deadline:
        break
time.sleep(0.5)  # and none of those left is answered later
for s in still:
    try:
        if s.recv(4096):
            refused["late"] = refused.get("late", 0) + 1
    except BlockingIOError:
        pass
print(json.dumps({"refused": refused, "held": len(still)}), flush=True)
sys.stdin.read()
'''


def _need_root() -> None:
    if os.getuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("these tests act as a second uid and need root")
        pytest.skip("needs root to act as a second uid")


@contextmanager
def holder(d: testing.Daemon, count: int, uid: int,
           expect: int) -> Iterator[dict[str, object]]:
    """`count` half-sent connections from `uid`, of which `expect` should be let in, held
    until the block ends."""
    group = os.stat(d.socket).st_gid  # the socket is 0660: its group may connect
    proc = subprocess.Popen([SYSTEM_PYTHON, "-c", HOLDER, str(d.socket), str(count),
                             str(expect)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            user=uid, group=group, extra_groups=[])
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the holder died before reporting"
        yield json.loads(line)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_one_uids_connections_are_capped_and_other_users_are_answered() -> None:
    """21 processes of one user with 1,000 half-sent requests each left others unanswered."""
    _need_root()
    d = testing.Daemon(cpus=2, memory="4GiB",
                       config="user_max_connections = 16\nmax_open_files = 512\n")
    try:
        d.start()
        with holder(d, 200, NOBODY, 16) as seen:
            assert seen["held"] == 16
            refused = seen["refused"]
            assert isinstance(refused, dict)
            assert refused.get("429") == 200 - 16, refused
            body = json.loads(refused["body"])
            assert body["error"]["code"] == "ResourceExhausted"
            assert "user_max_connections" in body["error"]["message"]
            # Another user (root here) is served while nobody's connections stay open.
            listed = run_cli(d, "job", "list", "--json")
            assert listed.returncode == 0, listed.stderr
            d.client().create_job({"name": "after", "command": ["true"], "cpu": "100m"})
            assert d.client().wait_job("after", timeout=30)["phase"] == "Succeeded"
        # Refusals are logged a few times, not once each.
        assert d.log().count("refused a connection") <= 3
    finally:
        d.close()


def test_a_full_daemon_says_it_is_overloaded_and_recovers() -> None:
    """The CLI died with a raw BlockingIOError traceback; the daemon logged 333 MB."""
    _need_root()
    d = testing.Daemon(cpus=2, memory="4GiB",
                       config="user_max_connections = 10000\nmax_open_files = 256\n")
    try:
        d.start()
        with holder(d, 400, NOBODY, 128) as seen:
            assert seen["held"] == 128  # 256 descriptors less the reserve of 128
            refused = seen["refused"]
            assert isinstance(refused, dict) and refused.get("503") == 400 - 128, refused
            listed = run_cli(d, "job", "list")
            assert listed.returncode == 1
            assert "overloaded" in listed.stderr and "Traceback" not in listed.stderr
        testing.wait_until(lambda: run_cli(d, "job", "list").returncode == 0,
                           "the daemon answers once the connections are gone")
        assert "Too many open files" not in d.log()
    finally:
        d.close()


def _closed_by_daemon(sock: socket.socket, deadline: float = 20.0) -> bool:
    sock.settimeout(deadline)
    try:
        return sock.recv(4096) == b""
    except (TimeoutError, ConnectionResetError):
        return False


def test_half_sent_headers_and_stalled_bodies_are_closed() -> None:
    d = testing.Daemon(cpus=2, memory="4GiB", config="idle_timeout = 1\nbody_timeout = 1\n")
    try:
        d.start()
        headers = socket.socket(socket.AF_UNIX)
        headers.connect(str(d.socket))
        headers.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n")
        body = socket.socket(socket.AF_UNIX)
        body.connect(str(d.socket))
        body.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 100\r\n\r\n{\"name\": ")
        silent = socket.socket(socket.AF_UNIX)
        silent.connect(str(d.socket))
        for sock in (headers, body, silent):
            assert _closed_by_daemon(sock)
            sock.close()
        # A slow but steady body is not cut off.
        slow = socket.socket(socket.AF_UNIX)
        slow.connect(str(d.socket))
        payload = json.dumps({"name": "slow", "command": ["true"], "cpu": "100m"}).encode()
        slow.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n")
        for i in range(0, len(payload), 16):
            slow.sendall(payload[i:i + 16])
            time.sleep(0.4)
        slow.settimeout(20)
        assert slow.recv(4096).startswith(b"HTTP/1.1 201")
        slow.close()
    finally:
        d.close()


def _fill_queue(path: Path) -> list[socket.socket]:
    queued = []
    while True:
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(str(path))
        except BlockingIOError:
            s.close()
            return queued
        queued.append(s)


def test_the_client_waits_out_a_full_queue_then_says_overloaded(tmp_path: Path) -> None:
    """A listening socket nobody accepts from: connect() gets EAGAIN once its queue is full,
    where the CLI used to die with a BlockingIOError traceback."""
    path = tmp_path / "full.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(0)
    queued = _fill_queue(path)
    try:
        with pytest.raises(errors.DaemonUnavailable, match="overloaded"):
            Transport(path).request("GET", "/v1/health", timeout=1)
        # The queue drains while the client waits: it gets through.
        drain = threading.Timer(0.3, lambda: [server.accept()[0].close()
                                              for _ in queued])
        drain.start()
        sock = socket.socket(socket.AF_UNIX)
        try:
            _connect_through_a_full_queue(sock, str(path), 5.0)
        finally:
            sock.close()
            drain.join()
    finally:
        for s in queued:
            s.close()
        server.close()


def test_a_repeated_warning_is_logged_a_few_times_with_a_count() -> None:
    """A descriptor flood wrote 333 MB of the same error lines in 90 s."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RepeatLimit(burst=3, window=0.2))
    logger = logging.getLogger("test.repeat")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        for fd in range(1000):
            logger.error("accept failed on fd %d: Too many open files", fd)
        logger.info("info is never limited")
        time.sleep(0.3)
        logger.error("accept failed on fd %d: Too many open files", 1001)
    finally:
        logger.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert len(lines) == 5
    assert lines[3] == "info is never limited"
    assert "and 997 more like it" in lines[4]
