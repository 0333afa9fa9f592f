"""Suspending and resuming a sweep (through the SDK, the CLI and a kill -9 of the daemon
in between), cancelling one while its smoke canary runs, and the sweep's estimate."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import noduslocal as nodus
from noduslocal import testing
from tests.conftest import run_cli


def gated(gate: Path, ran: Path) -> list[str]:
    """A task that notes its start, then waits for GATE (the canary, task 0, does not)."""
    return ["sh", "-c", f'echo "$NODUS_TASK_ID" >> {ran}; '
                        f'while [ "$NODUS_TASK_ID" != 0 ] && [ ! -e {gate} ]; do sleep 0.05; '
                        "done"]


def test_suspend_stops_running_cells_starts_none_and_resume_finishes(
        daemon: testing.Daemon, tmp_path: Path) -> None:
    gate, ran = tmp_path / "gate", tmp_path / "ran"
    sweep = nodus.Sweep({"command": gated(gate, ran)}, grid={"X": list(range(5))},
                        max_parallel=2, name="pause").run()
    client = daemon.client()
    # Running from its launch; its command starts once the child entered its cgroups and
    # namespace (a suspend before that left no mark: failed in CI).
    testing.wait_until(lambda: sweep.status()["counts"].get("Running") == 2
                       and ran.exists() and len(ran.read_text().split()) == 3,
                       "two cells running after the canary, their commands started")
    sweep.suspend()
    assert sweep.status()["phase"] == "Suspended"
    testing.wait_until(lambda: sweep.status()["counts"] == {
        "Succeeded": 1, "Suspended": 2, "Pending": 2}, "the running cells suspended")
    held = client.get_job("pause-4")
    assert held["hold"] == ("sweep pause is suspended; `noduslocal sweep resume pause` "
                            "releases its cells")
    gate.touch()
    time.sleep(1.0)
    assert sweep.status()["counts"].get("Succeeded") == 1, "a cell ran while suspended"
    assert sorted(ran.read_text().split()) == ["0", "1", "2"]
    sweep.resume()
    final = sweep.wait(timeout=60)
    assert (final["phase"], final["counts"]) == ("Succeeded", {"Succeeded": 5})
    # The suspended cells ran again (a second attempt), the held ones once.
    attempts = {c["index"]: c["attempts"] for c in sweep.cells()}
    assert attempts == {0: 1, 1: 2, 2: 2, 3: 1, 4: 1}


def test_a_sweep_suspended_during_its_canary_resumes_with_the_canary_first(
        daemon: testing.Daemon, tmp_path: Path) -> None:
    gate, order = tmp_path / "gate", tmp_path / "order"
    run = ["sh", "-c", f'echo "$NODUS_TASK_ID" >> {order}; '
                       f"while [ ! -e {gate} ]; do sleep 0.05; done"]
    sweep = nodus.Sweep({"command": run}, grid={"X": list(range(3))}, name="early").run()
    testing.wait_until(lambda: order.exists() and order.read_text().split() == ["0"],
                       "the canary's command started")  # Running comes a moment before
    sweep.suspend()
    testing.wait_until(lambda: daemon.client().get_job("early-0")["phase"] == "Suspended",
                       "the canary suspended")
    sweep.resume()
    assert sweep.status()["phase"] == "Canary"
    testing.wait_until(lambda: order.read_text().split() == ["0", "0"],
                       "the canary started again, alone")
    time.sleep(0.5)
    assert order.read_text().split() == ["0", "0"], "a cell passed the canary gate"
    gate.touch()
    final = sweep.wait(timeout=60)
    assert (final["phase"], final["counts"]) == ("Succeeded", {"Succeeded": 3})


def test_a_suspended_sweep_stays_suspended_across_a_kill9(tmp_path: Path) -> None:
    gate, ran = tmp_path / "gate", tmp_path / "ran"
    d = testing.Daemon(cpus=4, memory="8GiB")
    try:
        d.start()
        client = d.client()
        client.create_sweep({"name": "durable", "max_parallel": 2, "template": {
            "command": gated(gate, ran)}, "grid": {"X": list(range(6))}})
        testing.wait_until(lambda: client.get_sweep("durable")["counts"].get("Running") == 2,
                           "two cells running")
        assert client.suspend_sweep("durable")["phase"] == "Suspended"
        d.kill()  # perhaps before the stops landed: the new daemon finishes them
        d.start()
        testing.wait_until(lambda: client.get_sweep("durable")["counts"] == {
            "Succeeded": 1, "Suspended": 2, "Pending": 3}, "running cells suspended")
        gate.touch()
        time.sleep(1.0)
        assert client.get_sweep("durable")["phase"] == "Suspended"
        assert client.get_sweep("durable")["counts"].get("Succeeded") == 1
        assert client.resume_sweep("durable")["phase"] == "Running"
        final = client.wait_sweep("durable", timeout=60)
        assert (final["phase"], final["counts"]) == ("Succeeded", {"Succeeded": 6})
    finally:
        d.close()


def test_cli_suspend_resume_and_refusals(daemon: testing.Daemon, tmp_path: Path) -> None:
    gate, ran = tmp_path / "gate", tmp_path / "ran"
    created = run_cli(daemon, "map", "--no-code", "--no-wait", "--no-canary", "--name",
                      "cli", "--max-parallel", "1", "--", *gated(gate, ran), ":::", "1", "2")
    assert created.returncode == 0, created.stderr
    testing.wait_until(lambda: daemon.client().get_job("cli-1")["phase"] == "Running",
                       "a task running")
    done = run_cli(daemon, "sweep", "suspend", "cli", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["phase"] == "Suspended"
    again = run_cli(daemon, "sweep", "suspend", "cli")  # idempotent
    assert again.returncode == 0 and again.stdout.startswith("cli: Suspended"), again.stdout
    resumed = run_cli(daemon, "sweep", "resume", "cli")
    assert resumed.returncode == 0 and "cli: Running: resumed" in resumed.stdout
    not_suspended = run_cli(daemon, "sweep", "resume", "cli")
    assert not_suspended.returncode != 0
    assert "only a suspended sweep can be resumed" in not_suspended.stderr
    gate.touch()
    assert daemon.client().wait_sweep("cli", timeout=60)["phase"] == "Succeeded"
    ended = run_cli(daemon, "sweep", "suspend", "cli")
    assert ended.returncode != 0 and "has already ended (Succeeded)" in ended.stderr


def test_a_cancel_during_the_smoke_canary_stops_it(daemon: testing.Daemon,
                                                   tmp_path: Path) -> None:
    """The smoke canary runs outside the sweep's cells; a sweep cancel left it running."""
    started = tmp_path / "started"
    created = run_cli(daemon, "map", "--no-code", "--no-wait", "--name", "smokecancel",
                      "--canary-smoke", f"touch {started}; sleep 60", "--", "true", ":::",
                      "a", "b")
    assert created.returncode == 0, created.stderr
    testing.wait_until(started.exists, "the smoke canary running")
    client = daemon.client()
    client.cancel_sweep("smokecancel")
    testing.wait_until(lambda: client.get_job("smokecancel-canary")["phase"] == "Cancelled",
                       "the smoke canary cancelled")


def test_the_estimate_from_expected_duration_then_from_ended_cells(tmp_path: Path) -> None:
    d = testing.Daemon(cpus=4, memory="8GiB", config='gpu_hour_rates = { default = 2.0 }\n'
                       'simulate_gpus = "4xH100"\n')
    try:
        d.start()
        with d.as_default():
            gate = tmp_path / "gate"
            wait = ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]
            planned = nodus.Sweep({"command": wait, "gpu": "H100:2", "expected_duration": 3600},
                                  grid={"X": list(range(5))}, max_parallel=4,
                                  name="planned").run()
            est = planned.estimate()
            # 5 cells x 2 GPUs x 1 h x 2.0; two at once (4 GPUs), so three waves of an hour.
            assert est["cost"] == pytest.approx(20.0, abs=0.01)
            assert est["remaining"] == pytest.approx(20.0, abs=0.01)
            assert est["cells_left"] == 5 and est["basis"].startswith("expected_duration")
            assert 3 * 3600 - 5 <= est["finish_in_s"] <= 3 * 3600
            shown = run_cli(d, "sweep", "status", "planned").stdout
            assert "estimate  20.00" in shown and "expected_duration (3600 s)" in shown, shown
            planned.cancel()

            learnt = nodus.Sweep({"command": ["sleep", "0.5"], "gpu": 1},
                                 grid={"X": list(range(3))}, max_parallel=1,
                                 name="learnt").run()
            assert learnt.estimate()["cost"] is None, "nothing to learn from yet"
            final = learnt.wait(timeout=60)
            assert final["estimate"]["remaining"] == 0.0
            assert final["estimate"]["basis"] == "every cell has ended"
            assert final["estimate"]["cost"] == final["cost"]
    finally:
        d.close()
