"""Reading a job's log through a real daemon: a tail of a line longer than a tail reads comes
back cut and says so, every read of a log file happens off the event loop (a read stuck in
the file system leaves the daemon answering everyone), and a follower that leaves
mid-stream is no error in the daemon's log. Where a tail starts: tests/unit/test_log_tail_reads.py.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from noduslocal import testing
from noduslocal.daemon.api import streams
from noduslocal.sdk.api_client import ApiClient
from noduslocal.testing import wait_until

LONG = 64 << 20  # one line of 64 MiB, far past what a tail reads


def log_of(c: ApiClient, name: str, **params: object) -> bytes:
    return b"".join(c.logs(name, **params))  # type: ignore[arg-type]


def only_log(d: testing.Daemon) -> Path:
    (path,) = d.data_dir.glob("jobs/*/attempt-1/output.log")
    return path


def test_a_tail_of_a_line_longer_than_a_tail_reads_is_cut_and_says_so(
        own_daemon: testing.Daemon) -> None:
    daemon = own_daemon  # its own: only_log() finds the one job's log
    c = daemon.client()
    c.create_job({"name": "longline", "cpu": "100m", "command": [
        "sh", "-c", f"head -c {LONG} /dev/zero | tr '\\0' x; printf END"]})
    assert c.wait_job("longline", timeout=120)["phase"] == "Succeeded"
    assert only_log(daemon).stat().st_size == LONG + 3

    body = log_of(c, "longline", tail=1)
    note, _, rest = body.partition(b"\n")
    assert note.startswith(b"[noduslocal: ") and b"cut" in note, body[:200]
    assert len(rest) == streams.TAIL_BYTES and rest.endswith(b"xxxxEND"), len(rest)
    assert rest.count(b"x") == streams.TAIL_BYTES - 3

    # Short lines after it are whole lines, nothing said.
    c.create_job({"name": "after", "cpu": "100m", "command": [
        "sh", "-c", f"head -c {LONG} /dev/zero | tr '\\0' x; printf '\\nlast 1\\nlast 2\\n'"]})
    assert c.wait_job("after", timeout=120)["phase"] == "Succeeded"
    assert log_of(c, "after", tail=2) == b"last 1\nlast 2\n"


def test_a_log_swapped_for_a_fifo_is_never_opened_for_reading(
        own_daemon: testing.Daemon) -> None:
    """The log is swapped for a FIFO nobody writes (a cluster job's owner can write its
    attempt directory): reads of it return at once with nothing instead of waiting for a
    writer in open(), and the daemon answers and runs other jobs meanwhile. (Before, each
    read held one of the log threads until the FIFO was opened for writing.)"""
    daemon = own_daemon
    c = daemon.client()
    c.create_job({"name": "stuck", "cpu": "100m", "command": ["echo", "hi"]})
    assert c.wait_job("stuck", timeout=60)["phase"] == "Succeeded"
    log = only_log(daemon)
    fifo = log.with_name("stuck.fifo")
    os.mkfifo(fifo)
    os.replace(fifo, log)
    got: dict[str, bytes | BaseException] = {}

    def read(key: str, **params: object) -> None:
        try:
            got[key] = log_of(ApiClient(daemon.socket), "stuck", **params)
        except BaseException as exc:  # reported by the assertion below
            got[key] = exc

    readers = [threading.Thread(target=read, args=(key,), kwargs=params, daemon=True)
               for key, params in (("tail", {"tail": 1}), ("whole", {}),
                                   ("tail 5", {"tail": 5}))]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(60)
    assert got == {"tail": b"", "whole": b"", "tail 5": b""}, got
    assert c.transport.request("GET", "/v1/health", timeout=30)["status"] == "ok"
    c.create_job({"name": "other", "cpu": "100m", "command": ["echo", "other"]})
    assert c.wait_job("other", timeout=60)["phase"] == "Succeeded"
    assert log_of(c, "other") == b"other\n"


def test_a_follower_that_leaves_is_no_error_in_the_daemons_log(
        daemon: testing.Daemon) -> None:
    daemon.client().create_job({"name": "talker", "command": [
        "sh", "-c", "while :; do echo tick; sleep 0.05; done"]})
    wait_until(lambda: daemon.client().get_job("talker")["phase"] == "Running", "running")
    for _ in range(3):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(daemon.socket))
            sock.sendall(b"GET /v1/jobs/talker/logs?follow=1 HTTP/1.1\r\nHost: x\r\n\r\n")
            seen = b""
            while b"tick" not in seen:
                seen += sock.recv(65536)
            # Gone without a word, mid-stream, as Ctrl-C on `job logs -f` leaves.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00"
                            b"\x00\x00")
    time.sleep(0.5)  # lets the daemon's next write find the peer gone; no assertion on it
    daemon.client().cancel_job("talker")
    daemon.client().wait_job("talker", timeout=30)
    log = daemon.log()
    assert "Traceback" not in log and "Error handling request" not in log, log[-3000:]
