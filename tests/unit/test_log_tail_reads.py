"""Where a log's tail starts, without a daemon: lines counted from the end, a bounded read
(a line longer than the limit comes back cut, and says so), and a missing log's empty tail.
The daemon's reads of stuck and huge logs are in tests/daemon/test_logs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from noduslocal.daemon.api import streams


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("data", "lines", "start"), [
    (b"", 3, 0),
    (b"a\nb\nc\n", 0, 6),
    (b"a\nb\nc\n", 1, 4),
    (b"a\nb\nc\n", 2, 2),
    (b"a\nb\nc\n", 3, 0),
    (b"a\nb\nc\n", 9, 0),
    (b"a\nb\nc", 1, 4),  # a last line without its newline is a line
    (b"a\nb\nc", 2, 2),
    (b"\n\n\n", 2, 1),
])
def test_tail_start_counts_lines_from_the_end(tmp_path: Path, data: bytes, lines: int,
                                              start: int) -> None:
    tail = streams.tail_start(write(tmp_path / "log", data), lines)
    assert (tail.offset, tail.note) == (start, b"")


def test_a_tail_reads_at_most_its_limit_and_says_what_it_cut(tmp_path: Path) -> None:
    # One line longer than the limit: its end, cut, at the start of a character.
    path = write(tmp_path / "long", b"ab\n" + "é".encode() * 40 + b"\n")
    tail = streams.tail_start(path, 1, limit=22)
    assert b"cut" in tail.note and tail.note.endswith(b"\n"), tail.note
    assert path.read_bytes()[tail.offset:].decode() == "é" * 10 + "\n"
    # Fewer lines than asked fit: the whole lines that do, and it says how many.
    path = write(tmp_path / "many", b"".join(b"line %03d\n" % i for i in range(100)))
    tail = streams.tail_start(path, 50, limit=45)
    assert path.read_bytes()[tail.offset:] == b"line 095\nline 096\nline 097\nline 098\n" \
                                               b"line 099\n"
    assert b"5 lines" in tail.note and b"not 50" in tail.note, tail.note
    # Within the limit exactly: nothing cut.
    assert streams.tail_start(path, 5, limit=45) == streams.tail_start(path, 5)
    assert streams.tail_start(path, 5, limit=45).note == b""


def test_a_missing_log_has_an_empty_tail(tmp_path: Path) -> None:
    assert streams.tail_start(tmp_path / "none", 5).offset == 0
