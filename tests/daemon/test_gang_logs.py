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
from noduslocal.daemon.jobs.gang_logs import OFFSETS
from noduslocal.daemon.runtime.base import rank_dir
from noduslocal.daemon.runtime.shim import EXIT
from noduslocal.sdk.api_client import ApiClient
from noduslocal.testing import wait_until
from tests.conftest import run_cli
from tests.unit.test_gang_log_merge import assert_merged_once, lines_of

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


def test_each_rank_line_is_in_the_merged_log_exactly_once(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_job({"name": "loud", "cpu": "100m", "distributed": {"nodes": 2},
                  "command": [sys.executable, "-c", LOUD]})
    assert c.wait_job("loud", timeout=120)["phase"] == "Succeeded"
    ranks = {rank: log_of(c, "loud", rank) for rank in (0, 1)}
    assert all(len(lines_of(data)) == 4 * 4001 + 1 for data in ranks.values())
    assert b"progress 0.0\rprogress 0.1\rprogress 0.2\r\n" in ranks[0]
    assert_merged_once(log_of(c, "loud", "all"), ranks)


def test_a_gang_that_ended_while_the_daemon_was_down_has_its_merged_log(
        own_daemon: testing.Daemon, tmp_path: Path) -> None:
    daemon = own_daemon  # its own: it kills the daemon
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
        own_daemon: testing.Daemon) -> None:
    """What a daemon that died before its first merge (or an older one) left: nothing."""
    daemon = own_daemon  # its own: the job's attempt is its only one
    c = daemon.client()
    c.create_job({"name": "q", "cpu": "100m", "distributed": {"nodes": 2},
                  "command": ["sh", "-c", "echo rank $RANK says hi; echo rank $RANK bye"]})
    assert c.wait_job("q", timeout=60)["phase"] == "Succeeded"
    (directory,) = daemon.data_dir.glob("jobs/*/attempt-1")
    for name in (OFFSETS, "merged.log", "merged-stderr.log"):
        (directory / name).unlink(missing_ok=True)
    ranks = {rank: log_of(c, "q", rank) for rank in (0, 1)}
    assert_merged_once(log_of(c, "q", "all"), ranks)
