"""Issue 13, item 4: retention. Ended jobs past keep_ended lose their directory and outputs
(their history stays); blobs and uploads nothing names are deleted; nothing a running or
pending job, or a sweep that still runs, needs is ever collected, also while creates race
the pass; `du` shows each user's use and a quota refuses new work at create.

Blob files younger than the pass's grace are never deleted, so the tests age them (as a
blob uploaded long ago would be): then only the rows and the pins keep a blob.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from noduslocal import testing
from noduslocal.domain import errors
from tests.conftest import run_cli

HOUR = 3600.0


def gc(d: testing.Daemon, dry_run: bool = False) -> dict[str, Any]:
    return d.client().transport.request(
        "POST", "/v1/admin/gc", query={"dry_run": "true" if dry_run else "false"})


def du(d: testing.Daemon) -> dict[str, Any]:
    users = d.client().transport.request("GET", "/v1/du", query={"refresh": "true"})["users"]
    return {u["user"]: u for u in users}


def age_blobs(d: testing.Daemon) -> list[Path]:
    """Every stored blob, made an hour old."""
    then = time.time() - HOUR
    blobs = [p for p in (d.data_dir / "blobs").glob("??/*") if p.is_file()]
    for path in blobs:
        with contextlib.suppress(FileNotFoundError):  # collected meanwhile
            os.utime(path, (then, then))
    return blobs


def source_dir(tmp: Path, name: str, payload: str) -> Path:
    directory = tmp / name
    directory.mkdir()
    (directory / "data.txt").write_text(payload + "\n")
    return directory


def daemon_with(config: str, **kwargs: Any) -> Iterator[testing.Daemon]:
    d = testing.Daemon(config=config, **kwargs)
    try:
        yield d.start()
    finally:
        d.close()


@pytest.fixture
def box() -> Iterator[testing.Daemon]:
    """Ended jobs kept one second; passes only when a test asks."""
    yield from daemon_with('keep_ended = "1s"\ngc_every = "7d"\n')


def test_an_ended_job_past_its_time_loses_its_files_and_keeps_its_history(
        box: testing.Daemon) -> None:
    client = box.client()
    client.create_job({"name": "done", "command": ["sh", "-c", "echo result > out.txt; "
                                                   "echo to-the-log"],
                       "outputs": {"result": "out.txt"}})
    assert client.wait_job("done")["phase"] == "Succeeded"
    job_dir = box.data_dir / "jobs" / "1"
    assert job_dir.is_dir()
    time.sleep(1.1)
    (blob,) = age_blobs(box)

    dry = gc(box, dry_run=True)
    assert [j["name"] for j in dry["jobs"]] == ["done"] and dry["dry_run"] is True
    assert dry["blobs"] == 1 and job_dir.is_dir() and blob.exists()
    assert client.list_outputs("done")[0]["collected"] is True

    report = gc(box)
    assert [(j["name"], j["owner"]) for j in report["jobs"]] == [("done", "root")]
    assert report["jobs"][0]["bytes"] > 0 and report["blobs"] == 1
    assert not job_dir.exists() and not blob.exists()
    doc = client.get_job("done")
    assert doc["phase"] == "Succeeded" and doc["collected_at"] is not None
    assert doc["exit_code"] == 0 and doc["attempts"] == 1  # history stays
    events = [(e["phase"], e["reason"]) for e in map(
        json.loads, b"".join(client.events(job="done")).splitlines())]
    assert events[-1] == ("Succeeded", "Collected")
    for read in (lambda: b"".join(client.logs("done")), lambda: client.list_files("done")):
        with pytest.raises(errors.NotFound, match="removed by retention"):
            read()
    (listed,) = client.list_outputs("done")
    assert listed["collected"] is False and "removed by retention" in listed["skipped"]
    shown = run_cli(box, "job", "status", "done").stdout
    assert f"files:      removed by retention at {doc['collected_at']}" in shown
    logs = run_cli(box, "job", "logs", "done")
    assert logs.returncode != 0 and "removed by retention" in logs.stderr
    assert gc(box)["jobs"] == []  # once


def test_running_pending_and_fresh_work_keeps_everything(two_cpus: testing.Daemon,
                                                         tmp_path: Path) -> None:
    """A running and a pending job naming a source, a cell and the smoke canary of a sweep
    that still runs: nothing of theirs goes, however long ago the sweep's other cells (or
    its canary) ended."""
    box = two_cpus
    client = box.client()
    gate = tmp_path / "gate"
    source = client.upload_source([source_dir(tmp_path, "src", "kept")],
                                  contents_of_single_dir=True)
    wait = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    client.create_sweep({"name": "sw", "canary_smoke": "true", "max_parallel": 1,
                         "template": {"command": ["sh", "-c", f'[ "$X" = 0 ] || {{ {wait}; }}'],
                                      "cpu": "100m"},
                         "grid": {"X": [0, 1]}})
    testing.wait_until(lambda: client.get_job("sw-1")["phase"] == "Running", "cell 1")
    check = f"{wait}; grep -qx kept data.txt"
    for name in ("runs", "waits"):  # the second waits for the first's CPUs
        client.create_job({"name": name, "command": ["sh", "-c", check], "source": source,
                           "cpu": "1.5"})
    testing.wait_until(lambda: client.get_job("runs")["phase"] == "Running", "runs")
    time.sleep(1.1)
    age_blobs(box)
    report = gc(box)
    assert report["jobs"] == [] and report["blobs"] == 0 and report["sources"] == 0
    assert client.get_job("sw-0")["collected_at"] is None  # its sweep still runs
    assert client.get_job("sw-canary")["collected_at"] is None  # and so does the canary's
    assert client.get_job("waits")["phase"] == "Pending"
    gate.touch()
    for name in ("runs", "waits"):  # the pending one still finds its source
        assert client.wait_job(name, timeout=60)["phase"] == "Succeeded"
    assert client.wait_sweep("sw", timeout=60)["phase"] == "Succeeded"
    time.sleep(1.1)
    age_blobs(box)
    report = gc(box)
    assert sorted(j["name"] for j in report["jobs"]) == ["runs", "sw-0", "sw-1", "sw-canary",
                                                         "waits"]
    assert report["sources"] == 1 and report["blobs"] == 1  # the upload, named by nobody
    status = run_cli(box, "sweep", "status", "sw")  # its report needs no cell's files
    assert status.returncode == 0 and "Succeeded" in status.stdout, status.stderr
    with pytest.raises(errors.NotFound):
        client.transport.request("GET", f"/v1/sources/{source['sha256']}")


def test_a_users_own_keep_time_and_forever() -> None:
    d = testing.Daemon(config='keep_ended = "1s"\ngc_every = "7d"\n'
                              '[keep_ended_users]\nroot = "forever"\n')
    try:
        client = d.start().client()
        client.wait_job(client.create_job({"name": "kept", "command": ["true"]})["name"])
        time.sleep(1.1)
        assert gc(d)["jobs"] == []
        assert client.get_job("kept")["collected_at"] is None
        assert du(d)["root"]["keep_ended_s"] is None
        # A live edit: root's override gone, the default second applies.
        assert d.config_path is not None
        d.config_path.write_text('keep_ended = "1s"\ngc_every = "7d"\n')
        testing.wait_until(lambda: du(d)["root"]["keep_ended_s"] == 1.0, "the reload")
        assert [j["name"] for j in gc(d)["jobs"]] == ["kept"]
    finally:
        d.close()


@pytest.fixture
def two_cpus() -> Iterator[testing.Daemon]:
    yield from daemon_with('keep_ended = "1s"\ngc_every = "7d"\n', cpus=2)


@pytest.fixture
def racing() -> Iterator[testing.Daemon]:
    """Ended jobs kept three seconds (a create comes that soon after its upload was found),
    a pass every second."""
    yield from daemon_with('keep_ended = "3s"\ngc_every = "1s"\n', cpus=2)


@pytest.fixture
def quota() -> Iterator[testing.Daemon]:
    yield from daemon_with('user_disk_quota = "256KiB"\ngc_every = "7d"\n')


def test_creates_racing_the_pass_never_lose_what_they_need(racing: testing.Daemon,
                                                           tmp_path: Path) -> None:
    """Uploads, creates naming them (some sharing one source), outputs collected and
    downloaded, while passes run back to back and every blob is kept an hour old: every
    job finds its source, and an output that is listed can be downloaded until its job is
    collected."""
    d = racing
    stop = threading.Event()
    failures: list[str] = []
    passes = [0]

    def ager() -> None:
        while not stop.is_set():
            age_blobs(d)
            time.sleep(0.01)

    def collector() -> None:
        while not stop.is_set():
            gc(d)
            passes[0] += 1

    def worker(w: int) -> None:
        client = d.client()
        for i in range(6):
            name = f"w{w}-{i}"
            payload = "shared" if i % 2 else name
            src = source_dir(tmp_path, name, payload)
            try:
                source = client.upload_source([src], contents_of_single_dir=True)
                client.create_job({
                    "name": name, "cpu": "100m", "source": source,
                    "command": ["sh", "-c", f"grep -qx {payload} data.txt && "
                                            f"cp data.txt out.txt"],
                    "outputs": {"out": "out.txt"}})
                doc = client.wait_job(name, timeout=90)
                if doc["phase"] != "Succeeded":
                    failures.append(f"{name}: {doc['phase']} {doc['message']}")
                    continue
                target = tmp_path / f"{name}.out"
                try:
                    client.download_output(name, None, "out", target)
                except errors.NotFound as exc:
                    if "removed by retention" not in exc.message:
                        failures.append(f"{name}: {exc.message}")
                    continue
                if target.read_text() != payload + "\n":
                    failures.append(f"{name}: downloaded {target.read_text()!r}")
            except errors.NodusError as exc:
                failures.append(f"{name}: {exc.message}")

    helpers = [threading.Thread(target=ager), threading.Thread(target=collector)]
    workers = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for thread in helpers + workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=300)
    stop.set()
    for thread in helpers:
        thread.join(timeout=60)
    assert not failures, failures
    assert passes[0] > 10, passes
    time.sleep(3.1)
    age_blobs(d)
    gc(d)
    client = d.client()
    assert all(j["collected_at"] for j in client.list_jobs(all=True))
    assert not [p for p in (d.data_dir / "blobs").glob("??/*")]  # nothing named: gone
    assert os.listdir(d.data_dir / "jobs") == []


def test_a_directory_a_crash_left_behind_is_removed(box: testing.Daemon) -> None:
    client = box.client()
    for name in ("collected", "removed"):
        client.wait_job(client.create_job({"name": name, "command": ["true"]})["name"])
    client.remove_job("removed")
    time.sleep(1.1)
    gc(box)
    # As if the daemon died between the commit and the removal of each directory.
    for job_id in (1, 2):
        (box.data_dir / "jobs" / str(job_id) / "workspace").mkdir(parents=True)
    box.restart()
    assert box.client().get_job("collected")["collected_at"] is not None
    gc(box)
    assert os.listdir(box.data_dir / "jobs") == []


def test_du_shows_job_dirs_volumes_and_blobs(box: testing.Daemon, tmp_path: Path) -> None:
    client = box.client()
    client.create_volume("data")
    client.upload_source([source_dir(tmp_path, "src", "x" * 10_000)],
                         contents_of_single_dir=True)
    client.wait_job(client.create_job({
        "name": "writes", "volumes": {"/workspace/data": "data"},
        "command": ["sh", "-c", "head -c 300000 /dev/urandom > big; "
                                "head -c 200000 /dev/urandom > data/v"]})["name"])
    first = box.client().transport.request("GET", "/v1/du", query={"refresh": "true"})
    root = {u["user"]: u for u in first["users"]}["root"]
    assert root["jobs"] == 1 and root["workspaces"] >= 300_000
    again = box.client().transport.request("GET", "/v1/du", query={"refresh": "true"})
    assert again["measured_at"] == first["measured_at"]  # one walk per user per 5 s
    assert root["volumes"] >= 200_000 and root["blobs"] > 10_000
    assert root["total"] == root["workspaces"] + root["volumes"] + root["blobs"]
    table = run_cli(box, "du")
    assert table.returncode == 0, table.stderr
    assert table.stdout.split("\n")[0].split()[:3] == ["USER", "JOBS", "JOB"]
    assert table.stdout.split("\n")[1].split()[:2] == ["root", "1"]


def test_a_user_over_quota_is_refused_new_work_until_they_free_some(
        quota: testing.Daemon) -> None:
    d = quota
    client = d.client()
    big = {"name": "big", "command": ["sh", "-c", "head -c 400000 /dev/urandom > f"]}
    client.wait_job(client.create_job(big, idempotency_key="big-once")["name"])
    assert du(d)["root"]["total"] > 256 * 1024
    # A retry of the create that made it is answered with it, quota or not.
    assert client.create_job(big, idempotency_key="big-once")["name"] == "big"
    with pytest.raises(errors.ResourceExhausted, match="disk quota: new jobs of root"):
        client.create_job({"name": "next", "command": ["true"]})
    with pytest.raises(errors.ResourceExhausted, match="disk quota: new volumes"):
        client.create_volume("vol")
    refused = run_cli(d, "job", "run", "--name", "next", "--", "true")
    assert refused.returncode != 0 and "over the quota of 256.0 KiB" in refused.stderr
    assert "noduslocal job rm" in refused.stderr
    assert "(over)" in run_cli(d, "du").stdout
    assert client.list_jobs(all=True)[0]["name"] == "big"  # nothing half-created
    client.remove_job("big")
    testing.wait_until(lambda: "root" not in du(d), "the use drops")
    client.wait_job(client.create_job({"name": "next", "command": ["true"]})["name"])


def test_gc_says_what_it_removes_and_a_dry_run_removes_nothing(box: testing.Daemon) -> None:
    client = box.client()
    client.wait_job(client.create_job({"name": "old", "command": ["true"]})["name"])
    time.sleep(1.1)
    dry = run_cli(box, "gc", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would remove root/old of root" in dry.stdout
    assert "dry run: would remove the files of 1 ended jobs" in dry.stdout
    assert box.client().get_job("old")["collected_at"] is None
    done = run_cli(box, "gc")
    assert "removed the files of 1 ended jobs" in done.stdout
    assert box.client().get_job("old")["collected_at"] is not None


def test_a_sweep_whose_source_was_forgotten_is_not_retried_half_made(
        box: testing.Daemon, tmp_path: Path) -> None:
    client = box.client()
    source = client.upload_source([source_dir(tmp_path, "src", "x")],
                                  contents_of_single_dir=True)
    client.create_sweep({"name": "fails", "canary": "none",
                         "template": {"command": ["sh", "-c", '[ "$X" = 0 ]'],
                                      "source": source},
                         "grid": {"X": [0, 1]}})
    assert client.wait_sweep("fails", timeout=60)["phase"] == "Failed"
    time.sleep(1.1)
    assert gc(box)["sources"] == 1
    before = len(client.list_jobs(all=True))
    with pytest.raises(errors.Conflict, match="was removed by retention"):
        client.retry_sweep("fails")
    assert len(client.list_jobs(all=True)) == before


def test_du_with_nothing_held_says_so(box: testing.Daemon) -> None:
    empty = run_cli(box, "du")
    assert empty.returncode == 0 and empty.stdout == "nobody holds anything here yet\n"


def test_a_reloaded_gc_every_applies_without_a_restart() -> None:
    """The daemon's own pass, not one asked for: a week apart at start, a second after an
    edit of the config, and the ended job is collected by it."""
    d = testing.Daemon(config='keep_ended = "1s"\ngc_every = "7d"\n')
    try:
        client = d.start().client()
        client.wait_job(client.create_job({"name": "ended", "command": ["true"]})["name"])
        assert d.config_path is not None
        d.config_path.write_text('keep_ended = "1s"\ngc_every = "1s"\n')
        testing.wait_until(lambda: client.get_job("ended")["collected_at"] is not None,
                           "the daemon's own pass", timeout=30)
        # The log line follows the files' removal, which follows the commit readers see.
        testing.wait_until(lambda: "retention: removed 1 ended jobs' directories" in d.log(),
                           "the pass's log line", timeout=30)
    finally:
        d.close()
