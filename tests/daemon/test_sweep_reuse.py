"""Sweeps as reusable as jobs (issue 28): `sweep rm` frees an ended sweep's name and keeps
its history, `map --replace` and `client.map(replace=True)` take a name back, `sweeps` lists
every sweep, `job list` shows a sweep as one line; cells carry `parameters`; SDK jobs get the
caller's environment as CLI jobs do."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from tests.conftest import run_cli


def gated(gate: Path) -> str:
    """A task's shell line that runs until GATE exists."""
    return f"sh -c 'while [ ! -e {gate} ]; do sleep 0.05; done'"


def test_the_references_map_twice_with_sweep_rm_between(own_daemon: testing.Daemon) -> None:
    daemon = own_daemon  # its own: it reads every row of the database
    client = daemon.client()
    with daemon.as_default():
        first = nodus.Client().map("sh -c 'echo lr={lr}'", args={"lr": ["1e-4", "3e-4"]},
                                   name="lr-sweep")
        assert first.wait(timeout=60)["phase"] == "Succeeded"
        cells = first.cells()
        assert [c["parameters"] for c in cells] == [{"lr": "1e-4"}, {"lr": "3e-4"}]
        assert [c["params"] for c in cells] == [c["parameters"] for c in cells]  # the alias
        cost = first.status()["cost"]
        with pytest.raises(errors.AlreadyExists, match="sweep 'lr-sweep' already exists"):
            nodus.Client().map("echo {lr}", args={"lr": ["1"]}, name="lr-sweep")
        refused = run_cli(daemon, "job", "rm", "lr-sweep-0")
        assert refused.returncode == 1 and "`sweep rm`" in refused.stderr, refused

        removed = run_cli(daemon, "sweep", "rm", "lr-sweep")
        assert removed.returncode == 0, removed
        assert removed.stdout.strip() == "lr-sweep: removed; the name is free"
        with pytest.raises(errors.NotFound):
            client.get_sweep("lr-sweep")
        with pytest.raises(errors.NotFound):
            client.get_job("lr-sweep-0")
        assert client.list_sweeps() == [] and client.list_jobs(all=True) == []

        second = nodus.Client().map("sh -c 'echo lr={lr}'", args={"lr": ["1e-3"]},
                                    name="lr-sweep")
        assert second.wait(timeout=60)["counts"] == {"Succeeded": 1}
        assert [c["parameters"] for c in second.cells()] == [{"lr": "1e-3"}]
        assert b"".join(client.logs("lr-sweep-0")) == b"lr=1e-3\n"
    with sqlite3.connect(daemon.data_dir / "noduslocal.db") as db:
        sweeps = db.execute("SELECT id, name, removed_at FROM sweeps ORDER BY id").fetchall()
        old = db.execute("SELECT id, name, cost FROM jobs WHERE removed_at IS NOT NULL "
                         "ORDER BY id").fetchall()
        attempts = db.execute("SELECT COUNT(*) FROM attempts WHERE job_id IN "
                              f"({','.join(str(r[0]) for r in old)})").fetchone()[0]
    assert [(name, bool(at)) for _, name, at in sweeps] == [
        (f"lr-sweep~{sweeps[0][0]}", True), ("lr-sweep", False)]
    assert [name for _, name, _ in old] == [f"lr-sweep-{i}~{old[i][0]}" for i in range(2)]
    assert attempts == 2  # kept: fair share and the cost history count them
    assert round(sum(c or 0.0 for _, _, c in old), 6) == cost
    assert not any((daemon.data_dir / "jobs" / str(r[0])).exists() for r in old)


def test_sweep_rm_refuses_a_running_sweep_and_map_replace_cancels_it(
        daemon: testing.Daemon, tmp_path: Path) -> None:
    client = daemon.client()
    gate = tmp_path / "gate"
    started = run_cli(daemon, "map", "--no-code", "--no-canary", "--name", "busy", "--",
                      "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; echo {{}}",
                      ":::", "a", "b")
    assert started.returncode == 0, started
    testing.wait_until(lambda: client.get_sweep("busy")["phase"] == "Running", "running")
    refused = run_cli(daemon, "sweep", "rm", "busy")
    assert refused.returncode == 1 and "cancel it first" in refused.stderr, refused
    clash = run_cli(daemon, "map", "--no-code", "--name", "busy", "--", "echo", ":::", "x")
    assert clash.returncode != 0 and "already exists" in clash.stderr, clash
    unnamed = run_cli(daemon, "map", "--no-code", "--replace", "--", "echo", ":::", "x")
    assert unnamed.returncode == 2 and "--replace needs --name" in unnamed.stderr, unnamed

    replaced = run_cli(daemon, "map", "--no-code", "--no-canary", "--replace", "--name",
                       "busy", "--", "sh", "-c", "echo new-{}", ":::", "x")
    assert replaced.returncode == 0 and replaced.stdout.strip() == "busy", replaced
    assert client.wait_sweep("busy", timeout=60)["counts"] == {"Succeeded": 1}
    assert b"".join(client.logs("busy-0")) == b"new-x\n"
    assert [c["parameters"] for c in client.sweep_cells("busy")] == [{"1": "x"}]
    with pytest.raises(errors.NotFound):
        client.get_job("busy-1")  # the old sweep's second cell went with it

    # The SDK's replace=True does the same to an ended sweep.
    again = nodus.Client().map("echo {}", args=["y", "z"], name="busy", replace=True)
    assert again.wait(timeout=60)["counts"] == {"Succeeded": 2}
    grid = nodus.Sweep({"command": ["true"]}, grid={"X": [1]}, name="busy").run(replace=True)
    assert grid.wait(timeout=60)["counts"] == {"Succeeded": 1}
    assert [s["name"] for s in client.list_sweeps() if s["name"] == "busy"] == ["busy"]
    with pytest.raises(errors.InvalidArgument, match="replace: needs a name"):
        nodus.Client().map("echo {}", args=["y"], replace=True)


def test_sweeps_lists_every_sweep_and_job_list_one_line_per_sweep(
        own_daemon: testing.Daemon, tmp_path: Path) -> None:
    daemon = own_daemon  # its own: it looks at every sweep and job there is
    client = daemon.client()
    done = run_cli(daemon, "map", "--no-code", "--name", "ended", "--", "echo", ":::",
                   "1", "2", "3")
    assert done.returncode == 0, done
    client.wait_sweep("ended", timeout=60)
    gate = tmp_path / "gate"
    running = run_cli(daemon, "map", "--no-code", "--no-canary", "--no-wait", "--name",
                      "going", "--max-parallel", "1", "--", "sh", "-c",
                      f"while [ ! -e {gate} ]; do sleep 0.05; done", ":::", "a", "b", "c")
    assert running.returncode == 0, running
    single = run_cli(daemon, "job", "run", "--detach", "--name", "alone", "--", "true")
    assert single.returncode == 0, single
    client.wait_job("alone", timeout=60)

    def listed(*flags: str) -> list[tuple[str, str]]:
        got = run_cli(daemon, "sweeps", "--json", *flags)
        assert got.returncode == 0, got
        return [(s["name"], s["phase"]) for s in json.loads(got.stdout)]

    assert listed() == [("ended", "Succeeded"), ("going", "Running")]
    assert listed("--all") == listed()  # kept for old scripts; every sweep is the default
    assert listed("--running") == [("going", "Running")]
    table = run_cli(daemon, "sweeps").stdout
    assert "ended" in table and "going" in table

    def names(*flags: str) -> list[str]:
        got = run_cli(daemon, "job", "list", *flags)
        assert got.returncode == 0, got
        return [line.split()[0] for line in got.stdout.splitlines()[1:]]

    assert names("--all") == ["ended", "going", "alone"]
    assert names() == ["going"]
    line = run_cli(daemon, "job", "list", "--all").stdout.splitlines()[1]
    assert "sweep: 3 tasks listed (3 succeeded)" in line
    assert names("--all", "--cells") == ["ended-0", "ended-1", "ended-2", "going-0",
                                         "going-1", "going-2", "alone"]
    assert names("--all", "--cells", "--phase", "Succeeded") == [
        "ended-0", "ended-1", "ended-2", "alone"]
    assert names("--all", "--phase", "Succeeded", "--phase", "Running") == [
        "ended", "going", "alone"]
    as_json = json.loads(run_cli(daemon, "job", "list", "--all", "--json").stdout)
    assert len(as_json) == 7  # JSON is every job, for scripts
    gate.touch()
    client.wait_sweep("going", timeout=60)


def test_sdk_jobs_find_the_callers_tools(daemon: testing.Daemon, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    tool = tools / "mytool-28"
    tool.write_text("#!/bin/sh\necho \"tool $1 $MYVAR\"\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MYVAR", "from-the-caller")
    monkeypatch.setenv("NODUS_SECRETISH", "never-sent")

    # The reference's project.job("python3 train.py ..."): the caller's tools are found.
    log = nodus.Client().project().job("mytool-28 train").wait(timeout=60)
    assert (log.exit_code, log.output) == (0, "tool train from-the-caller\n")
    job = nodus.Job.create(command=["sh", "-c", "mytool-28 create; echo ${NODUS_SECRETISH-}"],
                           env={"MYVAR": "given"})  # env wins key by key
    assert job.wait(timeout=60)["phase"] == "Succeeded"
    assert b"".join(daemon.client().logs(job.name)) == b"tool create given\n\n"
    sweep = nodus.Client().map("mytool-28 {}", args=["a"], name="tools28", canary=False)
    assert sweep.wait(timeout=60)["counts"] == {"Succeeded": 1}
    assert b"".join(daemon.client().logs("tools28-0")) == b"tool a from-the-caller\n"

    bare = nodus.Client().project().job("mytool-28", export="NONE").wait(timeout=60)
    assert bare.exit_code == 127 and "not found in PATH" in bare.output
    only = nodus.Job.create(command=["sh", "-c", "echo \"$MYVAR\""], export="MYVAR")
    only.wait(timeout=60)
    assert b"".join(daemon.client().logs(only.name)) == b"from-the-caller\n"
    with pytest.raises(errors.InvalidArgument, match="NOT_SET_28 is not set"):
        nodus.Job.create(command=["true"], export="NOT_SET_28")


def test_a_path_not_found_clusters_readably(daemon: testing.Daemon) -> None:
    sweep = nodus.Client().map("no-such-tool-28 {}", args=["a", "b"], name="notools",
                               canary=False, export="NONE")
    status = sweep.wait(timeout=60)
    assert status["counts"] == {"Failed": 2}
    [group] = status["failures"]
    assert group["count"] == 2 and group["exit_code"] == 127
    assert "PATH:PATH" not in group["error"] and "(SEARCHPATH)" in group["error"], group
