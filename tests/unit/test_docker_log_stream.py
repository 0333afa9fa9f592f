"""dockerd's log stream as the container pump reads it: HTTP chunks and multiplexed frames
cut at any byte, and an ended container's copy waited for as long as it moves."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from noduslocal.daemon.runtime.docker.logs import HEADER, Dechunker, Frames, LogPump


def _chunked(pieces: list[bytes]) -> bytes:
    body = b"".join(b"%x;ext=1\r\n" % len(p) + p + b"\r\n" for p in pieces)
    return body + b"0\r\n\r\n"


def _frames(parts: list[tuple[int, bytes]]) -> bytes:
    return b"".join(HEADER.pack(stream, len(data)) + data for stream, data in parts)


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
    wire = _frames(parts)
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


def test_drain_waits_out_a_slow_copy_and_gives_up_on_a_stuck_one(tmp_path: Path) -> None:
    """The landing CI cut a busy container's log at a fixed 10 s: the copy was moving."""
    def pump(moving_for: float) -> LogPump:
        made = LogPump(lambda: None, "c" * 64, tmp_path, [])  # type: ignore[arg-type,return-value]

        def copy() -> None:
            ends = time.monotonic() + moving_for
            while time.monotonic() < ends:
                made.received += 1
                time.sleep(0.01)
            made.closed.wait()  # then stuck, as a dockerd that stops answering
        made.thread = threading.Thread(target=copy, daemon=True)
        made.start()
        return made

    slow = pump(moving_for=0.6)
    slow.closed.set()  # ends right after the copy stops moving
    assert slow.drain(0.2)
    stuck = pump(moving_for=0.3)
    assert not stuck.drain(0.2)
    assert stuck.thread.is_alive()
    stuck.stop()
