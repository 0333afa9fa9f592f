"""A sweep's jobs are found by the sweep's id, never by the `sweep` label or a name pattern
that any user can put on a job of their own: `sweep gc`, `Sweep.jobs()`, a canary's retry.

Two real Unix users share a project (the `box` of tests/system/test_multiuser.py): the label one
puts on a job must not let the other's sweep free it, list it, or block it.
"""

from __future__ import annotations

import json

from noduslocal import testing
from tests.system.test_multiuser import ALICE, BOB, SMALL, SYSTEM_PYTHON, Box, box  # noqa: F401

PROJECT = "team"


def test_sweep_gc_frees_only_the_sweeps_own_jobs(box: Box) -> None:  # noqa: F811
    """The review's attack: bob's sweep named like the label on alice's job frees bob's
    cells and leaves alice's workspace alone."""
    made = box.cli(ALICE, "job", "run", "--project", PROJECT, "--name", "precious",
                   "--label", "sweep=baseline", "--cpu", SMALL, "--", "/bin/sh", "-c",
                   "echo important > result.txt")
    assert made.returncode == 0, made.stderr
    swept = box.cli(BOB, "map", "--project", PROJECT, "--name", "baseline", "--no-code",
                    "--no-canary", "--cpu", SMALL, "--", "/bin/true", ":::", "1")
    assert swept.returncode == 0, swept.stderr
    waited = box.cli(BOB, "job", "wait", "baseline-0", "-p", PROJECT)  # (rich: not in lib)
    assert waited.returncode == 0, waited.stderr
    freed = box.cli(BOB, "sweep", "gc", "baseline", "-p", PROJECT, "--yes")
    assert freed.returncode == 0, freed.stderr
    listed = box.cli(ALICE, "ls", "precious", "-p", PROJECT)
    assert listed.returncode == 0, listed.stderr
    assert "result.txt" in listed.stdout
    # bob's own cell was freed
    gone = box.cli(BOB, "ls", "baseline-0", "-p", PROJECT)
    assert gone.returncode != 0 and "freed" in gone.stderr, gone.stderr


def test_anothers_labelled_running_job_neither_blocks_gc_nor_joins_the_sweeps_jobs(
        box: Box) -> None:  # noqa: F811
    blocker = box.cli(BOB, "job", "run", "--detach", "--project", PROJECT, "--name",
                      "blocker", "--label", "sweep=mine", "--cpu", SMALL, "--",
                      "/bin/sleep", "120")
    assert blocker.returncode == 0, blocker.stderr
    try:
        swept = box.cli(ALICE, "map", "--project", PROJECT, "--name", "mine", "--no-code",
                        "--no-canary", "--cpu", SMALL, "--", "/bin/true", ":::", "1", "2")
        assert swept.returncode == 0, swept.stderr
        for cell in ("mine-0", "mine-1"):
            assert box.cli(ALICE, "job", "wait", cell, "-p", PROJECT).returncode == 0
        # The SDK's Sweep.jobs() lists the cells alone, not bob's job with the label.
        script = ("import json, noduslocal as nodus; "
                  f"s = nodus.Sweep.from_name('mine', project={PROJECT!r}); "
                  "print(json.dumps([j['name'] for j in s.jobs()]))")
        listed = box.as_user(ALICE, SYSTEM_PYTHON, "-c", script)
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == ["mine-0", "mine-1"]
        freed = box.cli(ALICE, "sweep", "gc", "mine", "-p", PROJECT, "--yes")
        assert freed.returncode == 0, freed.stderr
        running = box.cli_json(BOB, "job", "status", "blocker", "-p", PROJECT, "--json")
        assert running["phase"] in ("Pending", "Starting", "Running")
    finally:
        box.cli(BOB, "job", "kill", "blocker", "-p", PROJECT)


def test_a_canary_retry_counts_its_own_tries_not_anothers_like_named_jobs(
        daemon: testing.Daemon) -> None:
    """The smoke canary's tries are the sweep's (by its id): a job named like a try that
    is not the sweep's does not shift the count."""
    client = daemon.client()
    client.create_sweep({"name": "gate", "canary_smoke": "exit 1", "max_parallel": 1,
                         "template": {"command": ["/bin/true"], "cpu": 0.1},
                         "grid": {"X": ["1", "2"]}})
    assert client.wait_sweep("gate", timeout=60)["phase"] == "Failed"
    client.create_job({"name": "gate-canary-r1", "command": ["/bin/true"], "cpu": 0.1,
                       "labels": {"sweep": "gate"}})
    client.wait_job("gate-canary-r1")
    client.retry_sweep("gate")
    assert client.get_job("gate-canary-r2")["labels"] == {"sweep": "gate"}
    names = {j["name"] for j in client.list_jobs(sweep="gate", all=True)}
    assert names == {"gate-0", "gate-1", "gate-0-r2", "gate-1-r2", "gate-canary",
                     "gate-canary-r2"}, names


