"""A gang's merged log (`logs --rank all`): each line a rank wrote is in it exactly once,
`[r<n>] ` prefixed, whatever the lines hold and however much the ranks print, read in
bounded pieces; a merge cut short by a kill repeats nothing; a gang that ended while the
daemon was down has every rank's lines once it is read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from noduslocal import testing
from noduslocal.daemon.jobs.gang_logs import OFFSETS, LogMerger, merged_path
from noduslocal.daemon.runtime.base import rank_dir
from noduslocal.daemon.runtime.host.shim import EXIT
from noduslocal.sdk.api_client import ApiClient
from noduslocal.testing import wait_until
from tests.conftest import run_cli

PREFIX = len(b"[r0] ")
# Bursts of numbered lines of many lengths, a progress bar's carriage returns, a last line
# without its newline; a pause between bursts so the merge reads them while they come.
LOUD = r'''
import os, sys, time
rank = os.environ["RANK"]
for burst in range(4):
    for i in range(4000):
        sys.stdout.write(f"rank {rank} burst {burst} line {i} " + "x" * (i % 300) + "\n")
    sys.stdout.write("".join(f"progress {burst}.{step}\r" for step in range(3)) + "\n")
    sys.stdout.flush()
    time.sleep(0.3)
sys.stdout.write(f"rank {rank} ends without a newline")
'''


def log_of(c: ApiClient, name: str, rank: int | str, **params: object) -> bytes:
    return b"".join(c.logs(name, rank=rank, **params))  # type: ignore[arg-type]


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


def test_each_rank_line_is_in_the_merged_log_exactly_once(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_job({"name": "loud", "cpu": "100m", "distributed": {"nodes": 2},
                  "command": [sys.executable, "-c", LOUD]})
    assert c.wait_job("loud", timeout=120)["phase"] == "Succeeded"
    ranks = {rank: log_of(c, "loud", rank) for rank in (0, 1)}
    assert all(len(lines_of(data)) == 4 * 4001 + 1 for data in ranks.values())
    assert b"progress 0.0\rprogress 0.1\rprogress 0.2\r\n" in ranks[0]
    assert_merged_once(log_of(c, "loud", "all"), ranks)


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


def test_a_gang_that_ended_while_the_daemon_was_down_has_its_merged_log(
        daemon: testing.Daemon, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    c = daemon.client()
    c.create_job({"name": "g", "cpu": "100m", "distributed": {"nodes": 2}, "command": [
        "sh", "-c", f"echo rank $RANK up; while [ ! -e '{gate}' ]; do sleep 0.05; done; "
                    "i=0; while [ $i -lt 500 ]; do echo rank $RANK line $i; i=$((i+1)); "
                    "done; echo rank $RANK done"]})
    wait_until(lambda: all(r["state"] == "Running" for r in c.get_job("g")["ranks"]),
               "both ranks running")
    (directory,) = daemon.data_dir.glob("jobs/*/attempt-1")
    daemon.kill()
    gate.touch()
    wait_until(lambda: all((rank_dir(directory, r) / EXIT).exists() for r in (0, 1)),
               "both ranks' ends recorded while the daemon is down")
    daemon.start()
    assert c.wait_job("g", timeout=60)["phase"] == "Succeeded"

    ranks = {rank: log_of(c, "g", rank) for rank in (0, 1)}
    assert all(b"line 499\n" in data for data in ranks.values()), ranks
    shown = run_cli(daemon, "job", "logs", "g", "--rank", "all")
    assert shown.returncode == 0, shown.stderr
    assert_merged_once(shown.stdout.encode(), ranks)
    assert json.loads((directory / OFFSETS).read_text())["done"] is True
    # Read again, it is the same file: nothing merged twice.
    assert log_of(c, "g", "all") == shown.stdout.encode()
    tail = run_cli(daemon, "job", "logs", "g", "--rank", "all", "--tail", "1")
    assert tail.stdout in ("[r0] rank 0 done\n", "[r1] rank 1 done\n"), tail.stdout


def test_a_merged_log_lost_with_its_offsets_is_made_again_when_read(
        daemon: testing.Daemon) -> None:
    """What a daemon that died before its first merge (or an older one) left: nothing."""
    c = daemon.client()
    c.create_job({"name": "q", "cpu": "100m", "distributed": {"nodes": 2},
                  "command": ["sh", "-c", "echo rank $RANK says hi; echo rank $RANK bye"]})
    assert c.wait_job("q", timeout=60)["phase"] == "Succeeded"
    (directory,) = daemon.data_dir.glob("jobs/*/attempt-1")
    for name in (OFFSETS, "merged.log", "merged-stderr.log"):
        (directory / name).unlink(missing_ok=True)
    ranks = {rank: log_of(c, "q", rank) for rank in (0, 1)}
    assert_merged_once(log_of(c, "q", "all"), ranks)
