"""`noduslocal admin`: every user's use against the limits, holding and releasing a user's
queue (kept across a restart), a job's priority, GPU drains, and a backup that restores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from noduslocal import testing
from noduslocal.domain import errors
from tests.conftest import run_cli


@pytest.fixture
def box() -> Iterator[testing.Daemon]:
    d = testing.Daemon(cpus=1, memory="2GiB",
                       config='simulate_gpus = "2xL4"\nuser_max_jobs = 4\n')
    try:
        yield d.start()
    finally:
        d.close()


def test_users_shows_use_and_limits(box: testing.Daemon) -> None:
    client = box.client()
    client.create_job({"name": "runs", "command": ["sleep", "60"], "gpu": "1"})
    testing.wait_until(lambda: client.get_job("runs")["phase"] == "Running", "runs")
    client.create_job({"name": "waits", "command": ["true"]})
    result = run_cli(box, "admin", "users", "--json")
    assert result.returncode == 0, result.stderr
    (root,) = [u for u in json.loads(result.stdout) if u["name"] == "root"]
    assert (root["running_jobs"], root["gpus_held"], root["pending_jobs"]) == (1, 1, 1)
    assert root["limits"]["max_jobs"] == 4 and root["held"] is None
    table = run_cli(box, "admin", "users").stdout.splitlines()
    assert table[0].split()[:3] == ["USER", "UID", "RUNNING"]
    assert table[1].split()[:5] == ["root", "0", "1", "1", "1"]


def test_a_held_queue_starts_nothing_until_released_even_across_a_restart(
        box: testing.Daemon) -> None:
    client = box.client()
    held = run_cli(box, "admin", "hold", "root", "--reason", "disk maintenance")
    assert held.returncode == 0, held.stderr
    client.create_job({"name": "later", "command": ["true"]})
    testing.wait_until(lambda: client.get_job("later")["hold"] ==
                       "your queue is held by admin root: disk maintenance", "the hold")
    box.restart()
    client = box.client()
    testing.wait_until(lambda: client.get_job("later")["hold"] is not None, "a pass")
    assert client.get_job("later")["phase"] == "Pending"
    users = json.loads(run_cli(box, "admin", "users", "--json").stdout)
    assert [u["held"]["reason"] for u in users if u["name"] == "root"] == ["disk maintenance"]
    assert run_cli(box, "admin", "release", "root").returncode == 0
    assert client.wait_job("later", timeout=30)["phase"] == "Succeeded"


def test_priority_moves_a_job_up_the_queue(box: testing.Daemon) -> None:
    client = box.client()
    client.wait_job(client.create_job({"name": "ended", "command": ["true"]})["name"])
    client.create_job({"name": "blocker", "command": ["sleep", "60"]})
    testing.wait_until(lambda: client.get_job("blocker")["phase"] == "Running", "blocker")
    for name in ("first", "second"):
        client.create_job({"name": name, "command": ["true"]})
    order = [e["name"] for e in client.queue()["pending"]]
    assert order == ["first", "second"]
    result = run_cli(box, "admin", "priority", "second", "10")
    assert (result.returncode, result.stdout) == (0, "second: priority 10\n"), result.stderr
    testing.wait_until(lambda: [e["name"] for e in client.queue()["pending"]] ==
                       ["second", "first"], "second first")
    assert client.get_job("second")["spec"]["priority"] == 10
    box.restart()  # kept in the job's spec
    assert box.client().get_job("second")["spec"]["priority"] == 10
    assert [e["name"] for e in box.client().queue()["pending"]] == ["second", "first"]
    client = box.client()
    with pytest.raises(errors.Conflict):
        client.transport.request("POST", "/v1/admin/jobs/ended/priority",
                                 body={"priority": 5})
    bad = run_cli(box, "admin", "priority", "second", "5000")
    assert bad.returncode == 2 and "5000 is not in the range -1000<=x<=1000" in bad.stderr


def test_admin_drains_gpus(box: testing.Daemon) -> None:
    assert run_cli(box, "admin", "drain", "1").returncode == 0
    gpus = json.loads(run_cli(box, "gpus", "--json").stdout)["gpus"]
    assert [g["drained"] for g in gpus] == [False, True]
    assert run_cli(box, "admin", "undrain", "1").returncode == 0


def test_admin_backup_restores(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    d = testing.Daemon(cpus=2, memory="4GiB")
    try:
        d.start()
        d.client().create_job({"name": "before", "command": ["true"]})
        d.client().set_secret("BEFORE", "1")
        dest = tmp_path / "nodus.backup"
        made = run_cli(d, "admin", "backup", str(dest))
        assert made.returncode == 0, made.stderr
        assert dest.stat().st_mode & 0o777 == 0o600
        again = run_cli(d, "admin", "backup", str(dest))
        assert again.returncode == 2 and "exists" in again.stderr
        # Made after the backup, and kept nowhere but the database (a job would not do:
        # recovery puts back a job its directory proves, once it has one).
        d.client().set_secret("AFTER", "2")
        d.stop()
        db = d.data_dir / "noduslocal.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        db.write_bytes(dest.read_bytes())
        d.start()
        assert {j["name"] for j in d.client().list_jobs(all=True)} == {"before"}
        assert {s["name"] for s in d.client().list_secrets()} == {"BEFORE"}
    finally:
        d.close()


def test_sigusr1_writes_the_state_and_the_daemon_goes_on(box: testing.Daemon) -> None:
    client = box.client()
    client.create_job({"name": "holds-the-cpu", "command": ["sleep", "60"]})
    testing.wait_until(lambda: client.get_job("holds-the-cpu")["phase"] == "Running",
                       "holds-the-cpu")
    client.create_sweep({"name": "dumped", "template": {"command": ["true"]},
                         "grid": {"X": [1, 2, 3]}})
    dump = box.state_dump()
    lines = dump.splitlines()
    board = next(line for line in lines if line.startswith("board: "))
    assert "'holds-the-cpu(" in board and ")#1:RUNNING'" in board
    # The sweep's canary waits in the queue behind the running job (one CPU); the other
    # cells are held by the sweep.
    (sweep,) = [line for line in lines if line.startswith("sweep ") and " dumped " in line]
    assert " Canary: " in sweep and "running [" in sweep
    queue = next(line for line in lines if line.startswith("queue: "))
    assert "(1)" in queue
    assert any("task store-writer: writer.py:" in line for line in lines)
    assert lines[-1] == "end of state dump"
    assert client.get_job("holds-the-cpu")["phase"] == "Running"  # it serves on
    client.cancel_job("holds-the-cpu")
