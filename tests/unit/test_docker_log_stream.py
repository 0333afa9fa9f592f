"""dockerd's log stream as the container pump reads it: HTTP chunks and multiplexed frames
cut at any byte, served over a real HTTP connection chunked or not, a quiet job's line
delivered at once, a superseded pump silent, and an ended container's copy waited for as
long as it moves."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests

from noduslocal.daemon.runtime.docker.logs import HEADER, Dechunker, Frames, LogPump


def _chunked(pieces: list[bytes]) -> bytes:
    body = b"".join(b"%x;ext=1\r\n" % len(p) + p + b"\r\n" for p in pieces)
    return body + b"0\r\n\r\n"


def _frame(stream: int, data: bytes) -> bytes:
    return HEADER.pack(stream, len(data)) + data


def _cuts(data: bytes, seed: int) -> list[bytes]:
    rng, out, at = random.Random(seed), [], 0
    while at < len(data):
        step = rng.choice((1, 2, 3, 7, 64, 4096))
        out.append(data[at:at + step])
        at += step
    return out


def test_a_chunked_body_comes_out_whole_however_the_reads_cut_it() -> None:
    pieces = [b"x" * n for n in (1, 2, 15, 16, 255, 4096)] + [b"a\r\nb\r\n", b"0\r\n"]
    wire = _chunked(pieces) + b"what follows the end is not the body"
    for seed in range(20):
        body, got = Dechunker(), b""
        for cut in _cuts(wire, seed):
            got += body.feed(cut)
        assert got == b"".join(pieces), seed
        assert body.ended


def test_frames_come_out_in_order_with_neighbours_of_one_stream_joined() -> None:
    parts = [(1, b"one\n"), (1, b"two\n"), (2, b"oops\n"), (1, b"three\n"), (0, b"in\n"),
             (2, b""), (2, b"bad\n")]
    wire = b"".join(_frame(stream, data) for stream, data in parts)
    whole = Frames().feed(wire)
    assert whole == [(1, b"one\ntwo\n"), (2, b"oops\n"), (1, b"three\nin\n"), (2, b"bad\n")]
    for seed in range(20):
        frames, got = Frames(), []
        for cut in _cuts(wire, seed):
            got += frames.feed(cut)
        joined: list[tuple[int, bytes]] = []
        for stream, data in got:
            if joined and joined[-1][0] == stream:
                joined[-1] = (stream, joined[-1][1] + data)
            else:
                joined.append((stream, data))
        assert joined == whole, seed


class NoRead1:
    def __init__(self, fp: Any) -> None:
        self.read, self.readline, self.readinto, self.close = (
            fp.read, fp.readline, fp.readinto, fp.close)


class Dockerd:
    """A TCP server answering every request with a log body, chunked as dockerd sends it
    (a chunk a frame) or plain until the connection closes; `hold` pauses it where the
    script says, until the test releases it."""

    def __init__(self, script: list[bytes | threading.Event], chunked: bool,
                 without_read1: bool = False) -> None:
        self.script, self.chunked, self.without_read1 = script, chunked, without_read1
        self.server = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def client(self) -> Any:
        port = self.server.getsockname()[1]
        session = requests.Session()

        def get(url: str, **kwargs: Any) -> requests.Response:
            response = session.get(url, **kwargs)
            if self.without_read1:  # as paramiko's file for an ssh:// docker host
                response.raw._fp.fp = NoRead1(response.raw._fp.fp)
            return response
        return SimpleNamespace(api=SimpleNamespace(
            base_url=f"http://127.0.0.1:{port}", api_version="1.41", get=get),
            close=session.close)

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker."
                         b"multiplexed-stream\r\n" + (
                             b"Transfer-Encoding: chunked\r\n\r\n" if self.chunked
                             else b"Connection: close\r\n\r\n"))
            for step in self.script:
                if isinstance(step, threading.Event):
                    step.wait(10)
                else:
                    conn.sendall(b"%x\r\n%s\r\n" % (len(step), step) if self.chunked else step)
            if self.chunked:
                conn.sendall(b"0\r\n\r\n")
        self.server.close()


def _until(test: Any, what: str) -> None:
    ends = time.monotonic() + 10
    while not test():
        assert time.monotonic() < ends, what
        time.sleep(0.01)


@pytest.mark.parametrize(("chunked", "without_read1"), [(True, False), (False, False),
                                                      (True, True)],
                         ids=["chunked", "plain", "chunked-without-read1"])
def test_the_pump_copies_a_stream_masks_across_frames_and_passes_a_quiet_line_at_once(
        tmp_path: Path, chunked: bool, without_read1: bool) -> None:
    lines = [_frame(1 + i % 3 // 2, b"line %d\n" % i) for i in range(3000)]
    quiet = threading.Event()
    script: list[bytes | threading.Event] = [
        *lines, _frame(1, b"token SEC"), _frame(1, b"RET here\n"), _frame(2, b"alone\n"),
        quiet, _frame(1, b"last\n")]
    dockerd = Dockerd(script, chunked, without_read1)

    async def run() -> None:
        pump = LogPump(dockerd.client, "c" * 64, tmp_path, [b"SECRET"], 0)
        pump.start()
        # A job that printed one line and went quiet: the line is in the file already.
        _until(lambda: (tmp_path / "stderr.log").exists()
               and (tmp_path / "stderr.log").read_bytes().endswith(b"alone\n"),
               "the quiet job's line")
        quiet.set()
        assert await pump.drained(5)
    asyncio.run(run())
    output = (tmp_path / "output.log").read_bytes()
    expected = b"".join(b"line %d\n" % i for i in range(3000))
    assert output == expected + b"token *** here\nalone\nlast\n"
    assert (tmp_path / "stderr.log").read_bytes() == b"".join(
        b"line %d\n" % i for i in range(3000) if i % 3 == 2) + b"alone\n"


def test_a_superseded_pump_writes_nothing_more(tmp_path: Path) -> None:
    """A pump started again (dockerd came back) truncates the files; the old one, woken
    later by a read it was blocked in, must not write into them."""
    more = threading.Event()
    dockerd = Dockerd([_frame(1, b"first\n"), more, _frame(1, b"late\n")], chunked=True)

    async def run() -> None:
        pump = LogPump(dockerd.client, "c" * 64, tmp_path, [], 0)
        pump.start()
        _until(lambda: (tmp_path / "output.log").exists()
               and (tmp_path / "output.log").read_bytes() == b"first\n", "the first line")
        pump.stop(discard=True)
        (tmp_path / "output.log").write_bytes(b"the new pump's\n")
        more.set()
        assert await pump.drained(5)
    asyncio.run(run())
    assert (tmp_path / "output.log").read_bytes() == b"the new pump's\n"


@pytest.fixture
def fake_copy() -> Iterator[list[LogPump]]:
    made: list[LogPump] = []
    yield made
    for pump in made:
        pump.stop()


def test_drained_waits_out_a_slow_copy_and_gives_up_on_a_stuck_one(
        tmp_path: Path, fake_copy: list[LogPump]) -> None:
    """The landing CI cut a busy container's log at a fixed 10 s: the copy was moving."""
    async def run() -> None:
        def pump(moving_for: float) -> LogPump:
            made = LogPump(lambda: None, "c" * 64, tmp_path, [])  # type: ignore[arg-type,return-value]
            fake_copy.append(made)

            def copy() -> None:
                ends = time.monotonic() + moving_for
                while time.monotonic() < ends:
                    made.received += 1
                    time.sleep(0.01)
                made.closed.wait()  # then stuck, as a dockerd that stops answering
            made._copy = copy  # type: ignore[method-assign]
            made.start()
            return made

        slow = pump(moving_for=0.6)
        slow.closed.set()  # ends right after the copy stops moving
        assert await slow.drained(0.2)
        stuck = pump(moving_for=0.3)
        assert not await stuck.drained(0.2)
        assert stuck.thread.is_alive()
    asyncio.run(run())
