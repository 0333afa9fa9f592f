"""Job dependencies against a real daemon: `job run --after` with each condition, a
dependency that can no longer be met ending the job Cancelled/DependencyNeverSatisfied, a
pipeline that runs in order, refusals at create, where the wait shows (status, queue,
estimate), sweeps that wait and jobs that wait for a sweep, and a kill -9 between steps."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.testing import wait_until
from tests.conftest import run_cli

Cli = Callable[..., subprocess.CompletedProcess[str]]


def _run(cli: Cli, *args: str) -> str:
    done = cli("job", "run", "-d", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_afterok_of_a_failed_job_is_never_satisfied(cli: Cli, daemon: testing.Daemon) -> None:
    client = daemon.client()
    _run(cli, "--name", "dep-pre", "--", "sh", "-c", "sleep 2; exit 1")
    _run(cli, "--name", "dep-ok", "--after", "dep-pre", "--", "true")
    _run(cli, "--name", "dep-any", "--after", "afterany:dep-pre", "--", "true")
    _run(cli, "--name", "dep-notok", "--after", "afternotok:dep-pre", "--", "true")
    waiting = client.get_job("dep-ok")
    assert waiting["phase"] == "Pending"
    assert waiting["hold"] == f"waiting for job {waiting['project']}/dep-pre (afterok)"
    status = cli("job", "status", "dep-ok")
    assert "waiting for job" in status.stdout and "after:" in status.stdout, status.stdout
    assert f"afterok:{waiting['project']}/dep-pre" in status.stdout
    assert client.get_job("dep-ok")["spec"]["after"][0]["condition"] == "afterok"
    ended = client.wait_job("dep-ok", timeout=60)
    assert (ended["phase"], ended["reason"]) == ("Cancelled", "DependencyNeverSatisfied")
    assert "dep-pre ended Failed" in ended["message"]
    assert ended["attempts"] == 0
    assert client.wait_job("dep-any", timeout=60)["phase"] == "Succeeded"
    assert client.wait_job("dep-notok", timeout=60)["phase"] == "Succeeded"
    # Named after it ended: judged at once.
    _run(cli, "--name", "dep-late", "--after", "dep-pre", "--", "true")
    assert client.wait_job("dep-late", timeout=60)["reason"] == "DependencyNeverSatisfied"


def test_a_three_step_pipeline_runs_in_order(daemon: testing.Daemon, tmp_path: Path) -> None:
    client = daemon.client()
    trail = tmp_path / "trail"
    for step, after in (("pipe-a", None), ("pipe-b", ["pipe-a"]), ("pipe-c", ["pipe-b"])):
        body = {"name": step, "command": ["sh", "-c", f"sleep 0.5; echo {step} >> {trail}"]}
        if after:
            body["after"] = after
        client.create_job(body)
    final = client.wait_job("pipe-c", timeout=60)
    assert final["phase"] == "Succeeded"
    assert trail.read_text().split() == ["pipe-a", "pipe-b", "pipe-c"]
    a, b = client.get_job("pipe-a"), client.get_job("pipe-b")
    assert a["ended_at"] <= b["started_at"] and b["ended_at"] <= final["started_at"]


def test_waiting_shows_in_the_queue_and_the_estimate(cli: Cli,
                                                     daemon: testing.Daemon) -> None:
    client = daemon.client()
    client.create_job({"name": "q-first", "command": ["sleep", "30"]})
    client.create_job({"name": "q-then", "command": ["true"], "after": ["q-first"]})
    wait_until(lambda: client.get_job("q-then")["hold"] is not None, "the gate's reason")
    queue = client.queue()
    entry = next(e for e in queue["pending"] if e["name"] == "q-then")
    assert entry["place"] is None and "waiting for job" in entry["hold"]
    assert "q-first (afterok)" in cli("queue").stdout
    estimate = client.estimate_job("q-then")
    assert estimate["start_at"] is None and "q-first (afterok)" in estimate["start_basis"]
    # Its owner cancels it while it waits: it never starts.
    client.cancel_job("q-then")
    assert client.get_job("q-then")["phase"] == "Cancelled"
    client.cancel_job("q-first")
    assert client.wait_job("q-first", timeout=30)["phase"] == "Cancelled"


def test_unknown_names_and_bad_grammar_are_refused(cli: Cli, daemon: testing.Daemon) -> None:
    for after in ("no-such-job", "afterwhen:x", "Bad_Name", "sweep:no-such-sweep"):
        done = cli("job", "run", "-d", "--after", after, "--", "true")
        assert done.returncode == 2, (after, done.stderr)
        assert done.stderr.startswith("noduslocal: after: "), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    # A job cannot wait for itself: its name is not taken until it is stored.
    done = cli("job", "run", "-d", "--name", "self-dep", "--after", "self-dep", "--", "true")
    assert done.returncode == 2 and "no job 'self-dep'" in done.stderr, done.stderr
    _run(cli, "--name", "self-rep", "--", "true")
    done = cli("job", "run", "-d", "--replace", "--name", "self-rep", "--after",
               "afterany:self-rep", "--", "true")
    assert done.returncode == 2 and "cannot wait for itself" in done.stderr, done.stderr
    assert daemon.client().get_job("self-rep")["phase"] in ("Pending", "Running",
                                                             "Succeeded")  # not replaced
    with pytest.raises(errors.InvalidArgument, match=r"^after: "):
        daemon.client().create_job({"command": ["true"], "after": "nope"})
    with pytest.raises(errors.InvalidArgument, match=r"^after: "):
        daemon.client().create_sweep({"after": ["nope"], "template": {"command": ["true"]},
                                      "grid": {"X": [1]}})


def test_another_project_is_named_with_its_project(daemon: testing.Daemon) -> None:
    client = daemon.client()
    client.create_job({"name": "xp-pre", "project": "dep-team", "command": ["true"]})
    with pytest.raises(errors.InvalidArgument, match="no job 'xp-pre'"):
        client.create_job({"command": ["true"], "after": ["xp-pre"]})
    client.create_job({"name": "xp-post", "command": ["true"], "after": ["dep-team/xp-pre"]})
    assert client.wait_job("xp-post", timeout=60)["phase"] == "Succeeded"


def test_a_sweep_waits_and_a_job_waits_for_a_sweep(daemon: testing.Daemon,
                                                   tmp_path: Path) -> None:
    client = daemon.client()
    trail = tmp_path / "trail"
    client.create_job({"name": "sw-pre", "command": ["sh", "-c",
                                                     f"sleep 1; echo pre >> {trail}"]})
    client.create_sweep({"name": "sw-grid", "after": ["sw-pre"], "max_parallel": 2,
                         "template": {"command": ["sh", "-c", f"echo cell >> {trail}"]},
                         "grid": {"X": [1, 2, 3]}})
    client.create_job({"name": "sw-post", "after": ["sweep:sw-grid"],
                       "command": ["sh", "-c", f"echo post >> {trail}"]})
    assert client.wait_job("sw-post", timeout=60)["phase"] == "Succeeded"
    assert client.wait_sweep("sw-grid", timeout=60)["phase"] == "Succeeded"
    assert trail.read_text().split() == ["pre", "cell", "cell", "cell", "post"]


def test_a_waiting_sweep_is_pending_and_a_failed_dependency_cancels_it(
        daemon: testing.Daemon, tmp_path: Path) -> None:
    client = daemon.client()
    go = tmp_path / "go"
    client.create_job({"name": "swf-pre", "command": [
        "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.1; done; exit 3"]})
    made = client.create_sweep({"name": "swf-grid", "after": ["swf-pre"],
                                "template": {"command": ["true"]}, "grid": {"X": [1, 2, 3]}})
    assert made["after"][0]["name"] == "swf-pre"
    sweep = client.get_sweep("swf-grid")
    assert sweep["phase"] == "Pending", sweep
    hold = client.get_job("swf-grid-0")["hold"]
    assert hold == f"sweep swf-grid: waiting for job {made['project']}/swf-pre (afterok)"
    with pytest.raises(errors.Conflict, match="waits for its dependencies"):
        client.suspend_sweep("swf-grid")
    shown = run_cli(daemon, "sweep", "status", "swf-grid")
    assert f"afterok:{made['project']}/swf-pre" in shown.stdout, shown.stdout
    go.touch()
    final = client.wait_sweep("swf-grid", timeout=60)
    assert (final["phase"], final["reason"]) == ("Cancelled", "DependencyNeverSatisfied")
    assert "swf-pre ended Failed" in final["message"]
    for cell in client.sweep_cells("swf-grid"):
        assert cell["phase"] == "Cancelled", cell
        job = client.get_job(cell["name"])
        assert (job["reason"], job["attempts"]) == ("DependencyNeverSatisfied", 0), job


def test_kill9_between_steps_loses_nothing(tmp_path: Path) -> None:
    trail, go = tmp_path / "trail", tmp_path / "go"
    d = testing.Daemon(cpus=2, memory="8GiB")
    try:
        d.start()
        client = d.client()
        client.create_job({"name": "k-a", "command": [
            "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.1; done; echo a >> {trail}"]})
        client.create_job({"name": "k-b", "after": ["k-a"],
                           "command": ["sh", "-c", f"echo b >> {trail}"]})
        client.create_job({"name": "k-c", "after": ["afterany:k-b"],
                           "command": ["sh", "-c", f"echo c >> {trail}"]})
        client.create_job({"name": "k-never", "after": ["afternotok:k-a"],
                           "command": ["sh", "-c", f"echo never >> {trail}"]})
        client.create_sweep({"name": "k-sweep", "after": ["k-a"], "canary": "none",
                             "template": {"command": ["true"]}, "grid": {"X": [1, 2]}})
        wait_until(lambda: client.get_job("k-a")["phase"] == "Running", "k-a running")
        d.kill()
        d.start()
        waiting = client.get_job("k-b")
        assert waiting["phase"] == "Pending", waiting
        assert waiting["hold"] == f"waiting for job {waiting['project']}/k-a (afterok)"
        assert client.get_sweep("k-sweep")["phase"] == "Pending"
        go.touch()
        assert client.wait_job("k-c", timeout=60)["phase"] == "Succeeded"
        d.kill()
        d.start()
        assert trail.read_text().split() == ["a", "b", "c"]
        assert client.wait_sweep("k-sweep", timeout=60)["phase"] == "Succeeded"
        never = client.wait_job("k-never", timeout=60)
        assert (never["phase"], never["reason"]) == ("Cancelled", "DependencyNeverSatisfied")
    finally:
        d.close()


def test_run_after_through_click_and_the_fast_path(daemon: testing.Daemon) -> None:
    """--network goes through click; the same --after works there."""
    done = run_cli(daemon, "job", "run", "-d", "--name", "fp-pre", "--", "true")
    assert done.returncode == 0, done.stderr
    done = run_cli(daemon, "job", "run", "--name", "fp-post", "--after", "fp-pre",
                   "--max-cost", "5", "--", "true")
    assert done.returncode == 0, done.stderr
    assert daemon.client().get_job("fp-post")["spec"]["after"][0]["name"] == "fp-pre"


def test_the_sdk_takes_handles(daemon: testing.Daemon) -> None:
    import noduslocal as nodus

    first = nodus.Job.create(name="sdk-a", command=["true"])
    second = nodus.Job.create(name="sdk-b", command=["true"], after=[first])
    assert second.wait().phase == "Succeeded"
    assert second.status().spec.after[0].name == "sdk-a"
    sweep = nodus.Sweep({"command": ["true"]}, grid={"X": [1, 2]}, name="sdk-sw",
                        after=[second]).run()
    last = nodus.Job.create(name="sdk-c", command=["true"], after=[sweep, "afterany:sdk-a"])
    assert last.wait().phase == "Succeeded"
    assert [d.kind for d in last.status().spec.after] == ["sweep", "job"]
    with pytest.raises(nodus.errors.InvalidArgument, match=r"^after: expected a Job"):
        nodus.Job.create(command=["true"], after=[3])


def test_the_reference_s_client_map_and_project_job_take_after(daemon: testing.Daemon) -> None:
    """client.map(..., after=) waits as a sweep; project.job(..., after=) takes the map's
    handle (a MapSweep, a kind of Sweep) as a sweep to wait for."""
    import noduslocal as nodus

    client = nodus.Client()
    first = nodus.Job.create(name="ref-first", command=["true"])
    swept = client.map("true {}", [1, 2], name="ref-map", canary=False, after=[first])
    job = client.project().job("true", name="ref-after-map", after=[swept])
    assert job.wait(timeout=120).exit_code == 0
    assert swept.wait().phase == "Succeeded"
    status = nodus.Job.from_name("ref-after-map").status()
    assert [(d.kind, d.name) for d in status.spec.after] == [("sweep", "ref-map")]
