"""A gang's merged log (`logs --rank all`) made from rank logs on disk, without a daemon: a
merge cut short by a kill between its write and its offsets repeats nothing, and a line
longer than one read is merged in bounded pieces. Through a real daemon:
tests/daemon/test_gang_logs.py."""

from __future__ import annotations

from pathlib import Path

from noduslocal.daemon.jobs.gang_logs import OFFSETS, LogMerger, merged_path

PREFIX = len(b"[r0] ")


def lines_of(data: bytes) -> list[bytes]:
    """The lines of a log, a last one without its newline included."""
    lines = data.split(b"\n")
    return lines[:-1] if lines[-1] == b"" else lines


def assert_merged_once(merged: bytes, ranks: dict[int, bytes]) -> None:
    """Every rank's lines, each once and in its order; nothing else, not a byte more."""
    merged_lines = lines_of(merged)
    assert merged.endswith(b"\n"), merged[-100:]
    for rank, data in ranks.items():
        prefix = b"[r%d] " % rank
        mine = [line[PREFIX:] for line in merged_lines if line.startswith(prefix)]
        assert mine == lines_of(data), (rank, len(mine), len(lines_of(data)))
    assert len(merged_lines) == sum(len(lines_of(data)) for data in ranks.values())
    unended = sum(1 for data in ranks.values() if data and not data.endswith(b"\n"))
    assert len(merged) == sum(len(data) + PREFIX * len(lines_of(data))
                              for data in ranks.values()) + unended


def rank_logs(directory: Path, stream: str, rank: int) -> Path:
    return directory / f"{stream}-{rank}.log"


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as file:
        file.write(data)


def test_a_merge_killed_between_its_write_and_its_offsets_repeats_nothing(
        tmp_path: Path) -> None:
    for rank in (0, 1):
        append(rank_logs(tmp_path, "all", rank), b"".join(
            b"rank %d early %d\n" % (rank, i) for i in range(1000)))
    LogMerger(tmp_path, 2, rank_logs).step()
    kept = (tmp_path / OFFSETS).read_bytes()
    for rank in (0, 1):
        append(rank_logs(tmp_path, "all", rank), b"".join(
            b"rank %d late %d\n" % (rank, i) for i in range(1000)))
    LogMerger(tmp_path, 2, rank_logs).step()
    # What a kill -9 after the merged write but before its offsets were kept leaves.
    (tmp_path / OFFSETS).write_bytes(kept)

    LogMerger(tmp_path, 2, rank_logs).step(final=True)
    ranks = {rank: rank_logs(tmp_path, "all", rank).read_bytes() for rank in (0, 1)}
    assert_merged_once(merged_path(tmp_path, "all").read_bytes(), ranks)


def test_a_line_longer_than_a_read_is_merged_in_bounded_pieces(tmp_path: Path) -> None:
    line = b"".join(b"%07d " % i for i in range(5 << 17))  # 5 MiB, one line
    append(rank_logs(tmp_path, "all", 0), b"before\n" + line + b"\nafter\n")
    append(rank_logs(tmp_path, "all", 1), b"rank 1\n")
    LogMerger(tmp_path, 2, rank_logs).step(final=True)
    merged = lines_of(merged_path(tmp_path, "all").read_bytes())
    mine = [piece[PREFIX:] for piece in merged if piece.startswith(b"[r0] ")]
    assert mine[0] == b"before" and mine[-1] == b"after", mine[:1]
    assert b"".join(mine[1:-1]) == line
    assert max(len(piece) for piece in mine) <= 1 << 20, [len(p) for p in mine]  # a read
    assert b"[r1] rank 1" in merged
