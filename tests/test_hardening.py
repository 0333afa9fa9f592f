"""Issue 10's findings, each reproduced against a real daemon: bad input is a 4xx naming the
field (never a 500, never accepted and lost later), job ids are never given twice after
the database forgot its newest jobs, and a damaged database is refused at start."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from noduslocal import testing
from tests.daemon.test_jobs_api import job_count, raw

BIG = "x" * 200_000  # one argument over the kernel's 128 KiB for a single string


@pytest.mark.parametrize(("method", "path", "body", "field"), [
    ("POST", "/v1/jobs", b'{"command": ["echo", "\xff\xfe"]}', "body"),
    ("POST", "/v1/volumes", b'{"name": "\xc3"}', "body"),
    ("PUT", "/v1/secrets/tok", b'{"value": "\xed\xa0\x80"}', "body"),
    ("POST", "/v1/jobs", b"[" * 5000 + b"]" * 5000, "body"),
    ("PUT", "/v1/secrets/tok", b'{"value": "\\ud800"}', "value"),
    ("POST", "/v1/jobs", b'{"command": ["echo", "\\udfff"]}', "command"),
    ("POST", "/v1/jobs", b'{"command": ["true"], "env": {"A": "\\ud800"}}', "env"),
    ("POST", "/v1/jobs", b'{"command": ["true"], "labels": {"a": "\\udfff"}}', "labels"),
    ("POST", "/v1/jobs", json.dumps({"command": ["echo", BIG]}).encode(), "command"),
    ("POST", "/v1/jobs", json.dumps({"command": ["true"], "env": {"A": BIG}}).encode(),
     "env"),
])
def test_bad_bodies_are_a_400_naming_the_field_and_create_nothing(
        daemon: testing.Daemon, method: str, path: str, body: bytes, field: str) -> None:
    status, reply = raw(daemon, method, path, body,
                        {"Content-Type": "application/json"})
    assert status == 400, reply
    assert reply["error"]["field"] == field, reply
    assert job_count(daemon) == 0
    assert daemon.client().list_volumes() == []
    assert "Traceback" not in daemon.log()


def test_arguments_and_environment_over_what_a_process_takes_are_refused() -> None:
    """The API's body limit (1 MiB) is below it; the SDK's own checks are not."""
    from noduslocal.domain import errors
    from noduslocal.domain.validation import parse_create

    with pytest.raises(errors.InvalidArgument, match=r"take .* bytes together") as refused:
        parse_create({"command": ["echo"], "args": ["y" * 100_000] * 12}, regions=("local",))
    assert refused.value.field == "args"


def test_bad_query_values_are_a_400(daemon: testing.Daemon) -> None:
    job = daemon.client().create_job({"command": ["true"]})
    daemon.client().wait_job(job["name"], timeout=30)
    for timeout in ("nan", "-5", "inf", "soon"):
        status, reply = raw(daemon, "GET", f"/v1/jobs/{job['name']}/wait?timeout={timeout}")
        assert status == 400 and reply["error"]["field"] == "timeout", (timeout, reply)
    status, reply = raw(daemon, "GET", f"/v1/jobs/{job['name']}/files?path={'a' * 5000}")
    assert status == 400 and reply["error"]["field"] == "path", reply
    status, reply = raw(daemon, "GET", f"/v1/jobs/{job['name']}/files?path={'a' * 300}/b")
    assert status == 400 and "longer than 255" in reply["error"]["message"], reply
    status, _ = raw(daemon, "GET", f"/v1/jobs/{job['name']}/wait?timeout=0")
    assert status == 200


def test_job_ids_are_never_given_twice_after_the_database_forgot_its_newest(
        tmp_path: Path) -> None:
    """A torn WAL: the database comes back without its newest jobs, whose directories stay
    (and whose shim may still run). Every new job then failed StartFailed: File exists."""
    d = testing.Daemon(cpus=2, memory="4GiB")
    try:
        d.start()
        client = d.client()
        client.create_job({"name": "kept", "command": ["true"]})
        client.wait_job("kept", timeout=30)
        db = d.data_dir / "noduslocal.db"
        d.stop()
        saved = db.read_bytes()  # the database as it was before the lost jobs
        d.start()
        marker = tmp_path / "lost-ran"
        client.create_job({"name": "lost", "command": [
            "sh", "-c", f"touch {marker}; sleep 300"]})
        testing.wait_until(marker.exists, "the job the database will forget to run")
        lost_dir = next(p for p in d.data_dir.glob("jobs/*") if p.name != "1")
        d.kill()
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        db.write_bytes(saved)
        d.start()
        client.create_job({"name": "after", "command": ["echo", "fine"]})
        assert client.wait_job("after", timeout=30)["phase"] == "Succeeded"
        assert max(int(p.name) for p in d.data_dir.glob("jobs/*")) > int(lost_dir.name)
        info = client.info()
        assert [o["job_id"] for o in info["orphans"]] == [int(lost_dir.name)]
        assert info["orphans"][0]["killed"] == 1
        pid = json.loads((lost_dir / "attempt-1" / "pid.json").read_text())
        testing.wait_until(lambda: testing.process_gone(pid["pid"]),
                           "the forgotten job's process to be killed")
        assert "is not in the database" in d.log()
    finally:
        d.close()


def test_a_damaged_database_is_refused_at_start_with_how_to_restore(tmp_path: Path) -> None:
    d = testing.Daemon(cpus=2, memory="4GiB")
    try:
        d.start()
        for i in range(200):  # pages enough that one in the middle holds rows
            d.client().create_job({"name": f"j{i}", "command": ["true"], "cpu": "100m",
                                   "labels": {"pad": "p" * 60}})
        db = d.data_dir / "noduslocal.db"
        d.stop()
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        size = db.stat().st_size
        with db.open("r+b") as file:
            file.seek(size // 2)
            file.write(os.urandom(4096))
        with pytest.raises(RuntimeError) as failed:
            d.start()
        message = str(failed.value)
        assert "is damaged" in message and "noduslocal admin backup" in message
        assert ".recover" in message
    finally:
        d.close()


def test_simulated_gpus_give_a_container_no_real_gpu(tmp_path: Path) -> None:
    """In --simulate-gpus mode a job's NVIDIA_VISIBLE_DEVICES=all reached its container."""
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        if os.environ.get("CI"):
            pytest.fail("docker is not running: scripts/test.sh starts it")
        pytest.skip("docker is not running")
    from tests.conftest import BUSYBOX

    d = testing.Daemon(cpus=2, memory="4GiB", config='simulate_gpus = "2xH100"\n')
    try:
        d.start()
        client = d.client()
        client.create_job({"name": "g", "image": BUSYBOX, "gpu": 1,
                           "env": {"NVIDIA_VISIBLE_DEVICES": "all"},
                           "command": ["sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"]})
        assert client.wait_job("g", timeout=60)["phase"] == "Succeeded"
        assert b"".join(client.logs("g")).decode().strip() == "void"
    finally:
        d.close()


def test_execs_are_capped_per_user_with_a_clear_refusal(tmp_path: Path) -> None:
    """One user's long execs filled the pool that other users' container starts needed."""
    import threading

    from noduslocal.domain import errors

    d = testing.Daemon(cpus=2, memory="4GiB", config="user_max_execs = 2\n")
    try:
        d.start()
        client = d.client()
        client.create_job({"name": "box", "command": ["sleep", "120"]})
        testing.wait_until(lambda: client.get_job("box")["phase"] == "Running", "box runs")
        gate = tmp_path / "gate"
        holding = [threading.Thread(target=client.exec_job, args=(
            "box", None, ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]))
            for _ in range(2)]
        for thread in holding:
            thread.start()
        testing.wait_until(lambda: _running_execs(gate) >= 2, "two execs running")
        with pytest.raises(errors.ResourceExhausted, match="user_max_execs = 2"):
            client.exec_job("box", None, ["true"])
        gate.touch()
        for thread in holding:
            thread.join(30)
        assert client.exec_job("box", None, ["echo", "again"])["returncode"] == 0
    finally:
        d.close()


def _running_execs(gate: Path) -> int:
    """Processes whose command line waits for GATE."""
    count = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(gate).encode() in cmdline.read_bytes():
                count += 1
        except OSError:
            pass
    return count


def test_admin_backup_restores(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    d = testing.Daemon(cpus=2, memory="4GiB")
    try:
        d.start()
        d.client().create_job({"name": "before", "command": ["true"]})
        dest = tmp_path / "nodus.backup"
        made = run_cli(d, "admin", "backup", str(dest))
        assert made.returncode == 0, made.stderr
        assert dest.stat().st_mode & 0o777 == 0o600
        again = run_cli(d, "admin", "backup", str(dest))
        assert again.returncode == 2 and "exists" in again.stderr
        d.client().create_job({"name": "after", "command": ["true"]})
        d.stop()
        db = d.data_dir / "noduslocal.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        db.write_bytes(dest.read_bytes())
        d.start()
        names = {j["name"] for j in d.client().list_jobs(all=True)}
        assert names == {"before"}
    finally:
        d.close()


def test_api_reads_never_wait_behind_output_collection(daemon: testing.Daemon) -> None:
    """Seven jobs with 1.5 GB sparse outputs made another user's file listing take 28 s:
    collection shared the default thread pool (six threads here) with the API's reads.
    Here seven 1 GiB outputs are hashed two at a time on threads of their own, and reads
    keep being answered meanwhile (with the shared pool, a handful would be)."""
    client = daemon.client()
    client.create_job({"name": "other", "command": ["sh", "-c", "echo hi > f"], "cpu": "100m"})
    assert client.wait_job("other", timeout=30)["phase"] == "Succeeded"
    big = [f"big-{i}" for i in range(7)]
    for name in big:
        client.create_job({"name": name, "command": ["truncate", "-s", "1G", "out"],
                           "cpu": "100m", "outputs": {"out": "out"}})
    exits = daemon.data_dir / "jobs"
    testing.wait_until(lambda: len(list(exits.glob("*/attempt-1/exit.json"))) == 8,
                       "every job's process has exited")
    answered = 0
    while sum(client.get_job(name)["phase"] == "Running" for name in big) >= 3:
        assert client.list_files("other")
        answered += 1
    assert answered >= 20, answered
    for name in big:
        assert client.wait_job(name, timeout=120)["phase"] == "Succeeded"


def test_container_starts_never_wait_behind_execs(docker_client: object) -> None:
    """One user's 32 `sleep 120` execs in their own container made another user's
    container job take 116 s to start: execs and launches shared one 32-thread pool."""
    import threading
    import uuid

    from tests.conftest import BUSYBOX

    d = testing.Daemon(cpus=2, memory="4GiB", config="user_max_execs = 32\n")
    try:
        d.start()
        client = d.client()
        client.create_job({"name": "box", "image": BUSYBOX, "cpu": "100m",
                           "command": ["sleep", "300"]})
        testing.wait_until(lambda: client.get_job("box")["phase"] == "Running", "box runs",
                           timeout=60)
        mark = uuid.uuid4().hex
        holding = [threading.Thread(target=client.exec_job, args=("box", None, [
            "sh", "-c", f"touch /workspace/held-{mark}-$$; "
                        f"while [ ! -e /workspace/gate-{mark} ]; do sleep 0.2; done"]))
            for _ in range(32)]
        for thread in holding:
            thread.start()
        workspace = next((d.data_dir / "jobs").glob("*/workspace"))
        try:
            testing.wait_until(lambda: len(list(workspace.glob(f"held-{mark}-*"))) == 32,
                               "32 execs running", timeout=120)
            client.create_job({"name": "next", "image": BUSYBOX, "cpu": "100m",
                               "command": ["echo", "started"]})
            assert client.wait_job("next", timeout=60)["phase"] == "Succeeded"
            assert all(thread.is_alive() for thread in holding)  # held all along
        finally:
            (workspace / f"gate-{mark}").touch()
            for thread in holding:
                thread.join(60)
        client.cancel_job("box")
    finally:
        d.close()


def test_doctor_runs_the_full_integrity_check(tmp_path: Path, lab_groups: None) -> None:
    """A corrupt page left the daemon saying healthy; quick_check at start catches pages,
    `noduslocal doctor` runs integrity_check too (an index that disagrees with its table)."""
    from tests.conftest import run_cli

    d = testing.Daemon(cpus=2, memory="4GiB")
    try:
        d.start()
        d.client().create_job({"name": "a", "command": ["true"], "cpu": "100m"})
        fine = run_cli(d, "doctor")
        assert fine.returncode == 0, fine.stdout + fine.stderr
        assert "OK   database: integrity_check: ok" in fine.stdout
        checks = json.loads(run_cli(d, "doctor", "--json").stdout)
        assert [c["name"] for c in checks][:3] == ["socket", "daemon", "groups"]
        # An index whose definition no longer matches its rows: every page reads fine
        # (quick_check passes), only integrity_check compares index and table.
        db = sqlite3.connect(d.data_dir / "noduslocal.db")
        index = db.execute("SELECT name FROM sqlite_master WHERE type = 'index' "
                           "AND tbl_name = 'jobs' AND sql IS NOT NULL").fetchone()[0]
        db.execute("PRAGMA writable_schema = ON")
        db.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?",
                   (f"CREATE INDEX {index} ON jobs (created_at DESC, name)", index))
        db.commit()
        db.close()
        broken = run_cli(d, "doctor")
        assert broken.returncode == 1
        assert "FAIL database:" in broken.stdout and "missing from index" in broken.stdout
    finally:
        d.close()


@pytest.mark.parametrize(("body", "field"), [
    ({"map": {"args": ["echo", "{}", ":::", "a", "b\0c"]}}, "map"),
    ({"map": {"args": ["echo", "{}", ":::", "a", BIG]}}, "map"),
    ({"map": {"args": ["echo", "{1}" * 9, ":::", "a", "y" * 100_000]}}, "map"),
    ({"map": {"command": ["echo", "{x}"], "rows": {"names": ["x"],
                                                   "values": [["a"], [BIG]]}}}, "map"),
    ({"grid": {"LR": ["1", BIG]}}, "grid"),
    ({"grid": {"LR": ["1", "a\0"], "BATCH": [1, 2]}}, "grid"),
])
def test_a_sweep_whose_cells_no_process_could_take_is_refused(
        daemon: testing.Daemon, body: dict[str, object], field: str) -> None:
    """Found by the fuzz: the sweep was accepted and each such cell ended Lost."""
    status, answer = raw(daemon, "POST", "/v1/sweeps", json.dumps(
        {"template": {"command": ["echo"]}, **body}).encode())
    assert status == 400 and answer["error"]["field"] == field, answer
    assert daemon.client().transport.request("GET", "/v1/sweeps")["sweeps"] == []
