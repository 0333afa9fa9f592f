"""Sweeps through a real daemon: the SDK's grid, the canary gate, the fan-out width, the
report, cancel, refusals, 10,000 cells in one call, `noduslocal map`, and kill -9 of the
daemon five times during a sweep."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import noduslocal as nodus
from noduslocal import errors, testing
from tests.conftest import run_cli


@pytest.fixture
def wide() -> Iterator[testing.Daemon]:
    """A daemon with room for 4 one-CPU tasks at once."""
    d = testing.Daemon(cpus=4, memory="8GiB")
    try:
        d.start()
        with d.as_default():
            yield d
    finally:
        d.close()


def logged(path: Path, what: str) -> list[str]:
    """A task's shell line that appends WHAT (expanded by the task's shell) to PATH."""
    return ["sh", "-c", f'echo "{what}" >> {path}']


def test_grid_cells_their_environment_and_the_report(daemon: testing.Daemon,
                                                     tmp_path: Path) -> None:
    out = tmp_path / "seen"
    sweep = nodus.Sweep(
        {"command": logged(out, "$NODUS_TASK_ID/$NODUS_WORLD_SIZE $NODUS_SWEEP LR=$LR "
                                "BS=$BS $SUPERCOMPUTER_TASK_ID/$SUPERCOMPUTER_WORLD_SIZE "
                                "$SUPERCOMPUTER_JOB")},
        grid={"LR": ["1e-4", "3e-4"], "BS": "8,16"}, repetitions=2, name="grid").run()
    status = sweep.wait(timeout=120)
    assert (status["phase"], status["reason"], status["counts"]) == (
        "Succeeded", "Completed", {"Succeeded": 8})
    lines = sorted(out.read_text().splitlines(), key=lambda x: int(x.split("/")[0]))
    assert lines[0] == "0/8 grid LR=1e-4 BS=8 0/8 grid"
    assert lines[3] == "3/8 grid LR=1e-4 BS=16 3/8 grid"
    assert lines[7] == "7/8 grid LR=3e-4 BS=16 7/8 grid"
    cells = sweep.cells()
    assert [c["index"] for c in cells] == list(range(8))
    assert [c["name"] for c in cells] == [f"grid-{i}" for i in range(8)]
    assert cells[5]["params"] == {"LR": "3e-4", "BS": "8"}
    assert all(c["phase"] == "Succeeded" and c["region"] == "local" and c["gpu"] is None
               and c["wall_s"] is not None for c in cells)
    assert [j["name"] for j in sweep.jobs()] == [c["name"] for c in cells]
    again = nodus.Sweep.from_name("grid")
    assert again.status()["cells"] == 8


def test_a_broken_command_costs_one_task(daemon: testing.Daemon) -> None:
    sweep = nodus.Sweep({"command": ["sh", "-c", "echo boom >&2; exit 3"]},
                        grid={"X": list(range(100))}, name="broken").run()
    status = sweep.wait(timeout=60)  # failed cells do not raise
    assert (status["phase"], status["reason"]) == ("Failed", "CanaryFailed")
    assert "exited with code 3" in status["message"]
    assert status["counts"] == {"Failed": 1, "Cancelled": 99}
    cells = sweep.cells()
    assert cells[0]["exit_code"] == 3
    assert all(c["attempts"] == 0 and c["reason"] == "CanaryFailed" for c in cells[1:])


def test_max_parallel_caps_running_cells_and_changes_live(wide: testing.Daemon,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "spans"
    gate = tmp_path / "gate"
    sweep = nodus.Sweep({"command": [
        "sh", "-c", f'echo "start $NODUS_TASK_ID $(date +%s.%N)" >> {out}; '
                    f'while [ ! -e {gate} ]; do sleep 0.05; done; '
                    f'echo "end $NODUS_TASK_ID $(date +%s.%N)" >> {out}']},
        grid={"X": list(range(6))}, max_parallel=2, name="width").run()
    client = wide.client()

    def running() -> int:
        return sweep.status()["counts"].get("Running", 0)

    gate.touch()  # the canary alone first
    testing.wait_until(lambda: sweep.status()["phase"] == "Running", "the canary to pass")
    gate.unlink()
    testing.wait_until(lambda: running() == 2, "two cells running")
    time.sleep(0.5)
    assert running() == 2, "max_parallel=2 let more start"
    held = client.get_job("width-5")
    assert held["phase"] == "Pending"
    assert held["hold"] == "sweep width: 2 of 2 cells running (max_parallel)"
    client.set_sweep("width", max_parallel=3)
    testing.wait_until(lambda: running() == 3, "a third cell after set --max-parallel 3")
    gate.touch()
    assert sweep.wait(timeout=60)["phase"] == "Succeeded"
    events = sorted((float(t), kind) for kind, _, t in
                    (line.split() for line in out.read_text().splitlines()))
    live = peak = 0
    for _, kind in events:
        live += 1 if kind == "start" else -1
        peak = max(peak, live)
    assert peak <= 3


def test_failed_cells_end_the_sweep_failed_with_its_report(daemon: testing.Daemon) -> None:
    sweep = nodus.Sweep({"command": ["sh", "-c", "exit $((NODUS_TASK_ID % 2))"]},
                        grid={"X": list(range(4))}, name="mixed").run()
    status = sweep.wait(timeout=60)
    assert (status["phase"], status["reason"]) == ("Failed", "CellsFailed")
    assert status["counts"] == {"Succeeded": 2, "Failed": 2}
    assert [c["exit_code"] for c in sweep.cells()] == [0, 1, 0, 1]


def test_a_suspended_cell_keeps_its_sweep_open_until_resumed(daemon: testing.Daemon,
                                                             tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    client = daemon.client()
    client.create_sweep({"name": "paused", "canary": "none", "template": {
        "command": ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]},
        "grid": {"X": [0, 1]}})
    testing.wait_until(lambda: client.get_job("paused-1")["phase"] == "Running",
                       "cell 1 running")
    client.suspend_job("paused-1")
    gate.touch()
    testing.wait_until(lambda: client.get_job("paused-0")["phase"] == "Succeeded",
                       "cell 0 done")
    time.sleep(0.5)
    assert client.get_sweep("paused")["phase"] == "Running"
    client.resume_job("paused-1")
    final = client.wait_sweep("paused", timeout=30)
    assert (final["phase"], final["counts"]) == ("Succeeded", {"Succeeded": 2})


def test_ten_thousand_cells_in_one_call_then_cancel(daemon: testing.Daemon) -> None:
    sweep = nodus.Sweep({"command": ["sleep", "30"]},
                        grid={"A": list(range(100)), "B": list(range(100))},
                        name="big").run()
    status = sweep.status()
    assert status["cells"] == 10_000
    assert sum(status["counts"].values()) == 10_000
    assert "cell_list" not in status and "cells" not in str(status["counts"])
    out = run_cli(daemon, "sweep", "status", "big")
    assert out.returncode == 0, out.stderr
    assert "0 of 10000 done" in out.stdout and "big-9999" not in out.stdout
    sweep.cancel()
    status = sweep.wait(timeout=60)
    assert status["phase"] == "Cancelled"
    assert status["counts"] == {"Cancelled": 10_000}


def test_the_same_key_gives_the_same_sweep(daemon: testing.Daemon) -> None:
    first = nodus.Sweep({"command": ["true"]}, grid={"X": [1, 2]}).run(idempotency_key="k1")
    second = nodus.Sweep({"command": ["true"]}, grid={"X": [1, 2]}).run(idempotency_key="k1")
    assert first.name == second.name
    assert len(daemon.client().list_sweeps(all=True)) == 1


def test_refusals_name_the_field_and_create_nothing(daemon: testing.Daemon) -> None:
    client = daemon.client()
    client.create_job({"name": "taken-1", "command": ["true"]})
    cases = [
        (dict(grid={"gpu": ["H100"]}), "gpu: 1 x H100 requested; this host has no GPUs"),
        (dict(grid={"region": ["local", "us-east-1"]}), "'us-east-1' is not a region"),
        (dict(grid={"bad key": [1]}), "'bad key' is neither gpu, region nor"),
        (dict(name="taken", grid={"X": [1, 2]}), "job 'taken-1' already exists"),
    ]
    for kwargs, message in cases:
        with pytest.raises((errors.InvalidArgument, errors.AlreadyExists), match=message):
            nodus.Sweep({"command": ["true"]}, **kwargs).run()
    with pytest.raises(errors.Unsupported, match="target"):
        nodus.Sweep(lambda: None)  # type: ignore[arg-type]
    with pytest.raises(errors.Unsupported, match="max_cost"):
        nodus.Sweep({"command": ["true"]}, max_cost=5)
    assert client.list_sweeps(all=True) == []
    assert [j["name"] for j in client.list_jobs(all=True)] == ["taken-1"]


def test_map_runs_tasks_with_super_map_variables(daemon: testing.Daemon,
                                                 tmp_path: Path) -> None:
    out = tmp_path / "map"
    created = run_cli(daemon, "map", "--no-code", "--name", "m", "--", "sh", "-c",
                      f'echo "$0 $SUPERCOMPUTER_TASK_ID $SUPERCOMPUTER_WORLD_SIZE '
                      f'$SUPERCOMPUTER_JOB" >> {out}', ":::", "a", "b", "c")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "m"
    waited = run_cli(daemon, "sweep", "wait", "m")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert sorted(out.read_text().splitlines()) == ["a 0 3 m", "b 1 3 m", "c 2 3 m"]
    listed = json.loads(run_cli(daemon, "sweeps", "--all", "--json").stdout)
    assert [(s["name"], s["phase"]) for s in listed] == [("m", "Succeeded")]
    cells = json.loads(run_cli(daemon, "sweep", "status", "m", "--cells", "--json").stdout)
    assert [c["params"] for c in cells["cell_list"]] == [{"1": "a"}, {"1": "b"}, {"1": "c"}]


def test_map_stops_at_a_failing_canary_and_reads_stdin(daemon: testing.Daemon) -> None:
    failed = run_cli(daemon, "map", "--no-code", "--name", "bad", "--", "sh", "-c",
                     "exit 7", input="1\n2\n3\n")
    assert failed.returncode == 1
    assert "the canary (cell 0) ended Failed: exited with code 7" in failed.stderr
    status = daemon.client().get_sweep("bad")
    assert status["counts"] == {"Failed": 1, "Cancelled": 2}


def test_map_uploads_the_code_once(daemon: testing.Daemon, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "task.sh").write_text('echo "task $1" > result.txt\n')
    created = run_cli(daemon, "map", "--code", str(code), "--name", "coded", "--no-canary",
                      "--", "sh", "task.sh", ":::", "x", "y")
    assert created.returncode == 0, created.stderr
    assert run_cli(daemon, "sweep", "wait", "coded").returncode == 0
    client = daemon.client()
    assert client.download_file("coded-1", None, "result.txt", tmp_path / "r").read_text() \
        == "task y\n"


def test_map_retries_a_failed_task_after_a_pause_but_not_exit_127(
        daemon: testing.Daemon, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    # Task "a" fails on its first run only; task "b" cannot be executed at all.
    created = run_cli(daemon, "map", "--no-code", "--no-canary", "--retries", "2",
                      "--name", "flaky", "--", "sh", "-c",
                      f'[ "$0" = b ] && exit 127; [ -e {marks}/$0 ] && exit 0; '
                      f'touch {marks}/$0; exit 1', ":::", "a", "b")
    assert created.returncode == 0, created.stderr
    client = daemon.client()
    final = client.wait_sweep("flaky", timeout=60)
    events = [json.loads(line) for line in b"".join(client.events(job="flaky-0")).splitlines()]
    assert [e["message"] for e in events if e["reason"] == "Retrying"] == [
        "exited with code 1; retrying in 1s, 1 retry left"]
    assert final["counts"] == {"Succeeded": 1, "Failed": 1}
    cells = client.sweep_cells("flaky")
    assert [(c["attempts"], c["exit_code"]) for c in cells] == [(2, 0), (1, 127)]
    assert client.get_job("flaky-0")["retries_used"] == 1


def test_a_task_waiting_for_its_retry_says_so_and_can_be_cancelled(
        daemon: testing.Daemon) -> None:
    created = run_cli(daemon, "map", "--no-code", "--no-canary", "--retries", "6",
                      "--name", "doomed", "--", "false", ":::", "x")
    assert created.returncode == 0, created.stderr
    client = daemon.client()
    # Pauses of 1 and 2 s; after the third failure it waits 4 s: time to look and cancel.
    job = testing.wait_until(lambda: (j := client.get_job("doomed-0"))["retries_used"] == 3
                             and j["reason"] == "Retrying" and j, "three failed runs")
    assert job["hold"].startswith("retrying in ")
    client.cancel_job("doomed-0")
    assert client.wait_sweep("doomed", timeout=30)["counts"] == {"Cancelled": 1}
    time.sleep(1)
    assert client.get_job("doomed-0")["attempts"] == 3


def test_map_refuses_what_it_cannot_do_yet(daemon: testing.Daemon) -> None:
    for flag, value in (("--webhook", "http://127.0.0.1:9/"), ("--from", "job-1"),
                        ("--canary-smoke", "true")):
        done = run_cli(daemon, "map", "--no-code", flag, value, "--", "echo", ":::", "a")
        assert done.returncode == 2
        assert "is not supported by noduslocal yet" in done.stderr
    assert daemon.client().list_sweeps(all=True) == []


def test_every_task_ends_exactly_once_across_five_kill9s(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    d = testing.Daemon(cpus=4, memory="8GiB")
    try:
        d.start()
        client = d.client()
        client.create_sweep({"name": "kills", "max_parallel": 4, "template": {
            "command": ["sh", "-c", f'sleep 0.3; echo "$NODUS_TASK_ID" >> {ran}']},
            "grid": {"X": list(range(50))}})
        for _ in range(5):
            time.sleep(0.7)
            d.kill()
            d.start()
        final = client.wait_sweep("kills", timeout=180)
        assert (final["phase"], final["counts"]) == ("Succeeded", {"Succeeded": 50})
        counts = Counter(ran.read_text().split())
        assert counts == Counter(str(i) for i in range(50)), \
            f"ran twice: {[k for k, v in counts.items() if v > 1]}"
        cells = client.sweep_cells("kills")
        assert all(c["attempts"] == 1 for c in cells), [c for c in cells if c["attempts"] != 1]
    finally:
        d.close()
