"""A damaged database: a torn WAL drops the newest commits while the jobs' directories stay
(the review's shape on a real daemon: 30 finished jobs, kill -9, one byte flipped in a
middle WAL frame, start) and every lost job comes back from its directory, said loudly
(health, the log, `doctor` for a user who is no admin), never "nothing ran" of a directory
holding an exit record; job ids are never given twice after the database forgot its newest
jobs; a damaged file is refused at start with how to restore it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import noduslocal
from noduslocal import testing
from noduslocal.daemon.files.layout import RECORD, RECORD_XATTR
from noduslocal.domain.sockets import SOCKET_ENV
from tests.system.lab import SOCKET_GROUP, SYSTEM_PYTHON, copy_tree, open_up, run

USER = "nlwalrec"  # a user of this module's own: other modules' users are never touched
DEADLINE = 60.0
WAL_HEADER, FRAME_HEADER = 32, 24

# Run as USER with the library copy: create jobs with the SDK's client and wait for them.
USER_JOBS = '''
import json, sys
from noduslocal.sdk.api_client import ApiClient
client = ApiClient(sys.argv[1])
for name, code in json.loads(sys.argv[2]):
    client.create_job({"name": name, "cpu": 0.1, "labels": {"who": "user"},
                       "command": ["/bin/sh", "-c", f"echo out-{name}; exit {code}"]})
for name, _ in json.loads(sys.argv[2]):
    print(json.dumps(client.wait_job(name, timeout=120)))
'''


@dataclass
class Lab:
    lib: Path
    uid: int

    def run(self, d: testing.Daemon, *argv: str) -> subprocess.CompletedProcess[str]:
        """ARGV as USER, with a clean environment and the library copy to import."""
        env = ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/", "LANG=C.UTF-8",
               f"{SOCKET_ENV}={d.socket}", f"PYTHONPATH={self.lib}",
               "PYTHONDONTWRITEBYTECODE=1"]
        return subprocess.run(["runuser", "-u", USER, "--", "env", "-i", *env, *argv],
                              capture_output=True, text=True, timeout=DEADLINE * 3,
                              cwd=self.lib)

    def doctor(self, d: testing.Daemon) -> dict[str, dict[str, Any]]:
        done = self.run(d, SYSTEM_PYTHON, "-m", "noduslocal.cli", "doctor", "--json")
        assert "Traceback" not in done.stderr, done.stderr
        return {c["name"]: c for c in json.loads(done.stdout)}


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """A user in the socket group who is no admin, with a copy of the library it can read
    (the checkout's interpreter lives under /root)."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the WAL recovery test needs root (a second Unix user)")
        pytest.skip("needs root: runs doctor as a second Unix user")
    made_group = subprocess.run(["getent", "group", SOCKET_GROUP],
                                capture_output=True).returncode != 0
    run("groupadd", "-f", SOCKET_GROUP)
    run("userdel", "-r", USER, check=False)  # left over from an interrupted run
    run("useradd", "-M", "-G", SOCKET_GROUP, USER)
    lib = Path(tempfile.mkdtemp(prefix="nl-walrec-", dir="/tmp"))
    try:
        copy_tree(Path(noduslocal.__file__).parent, lib / "noduslocal")
        import click
        import pathspec

        copy_tree(Path(click.__file__).parent, lib / "click")
        copy_tree(Path(pathspec.__file__).parent, lib / "pathspec")
        open_up(lib)
        yield Lab(lib, int(run("id", "-u", USER).stdout))
    finally:
        shutil.rmtree(lib, ignore_errors=True)
        run("userdel", USER, check=False)
        if made_group:
            run("groupdel", SOCKET_GROUP, check=False)


def wal_frames(wal: bytes) -> tuple[int, list[int]]:
    """The page size and the offset of each frame of the WAL's current generation (its
    salts match the header's; frames left over from before a checkpoint do not)."""
    page_size = struct.unpack(">I", wal[8:12])[0]
    salts = wal[16:24]
    frames, offset = [], WAL_HEADER
    while offset + FRAME_HEADER + page_size <= len(wal):
        if wal[offset + 8:offset + 16] != salts:
            break
        frames.append(offset)
        offset += FRAME_HEADER + page_size
    return page_size, frames


def flip_middle_frame(db: Path) -> None:
    wal_path = Path(f"{db}-wal")
    wal = bytearray(wal_path.read_bytes())
    page_size, frames = wal_frames(bytes(wal))
    assert len(frames) > 10, f"the WAL holds only {len(frames)} frames"
    at = frames[len(frames) // 2] + FRAME_HEADER + page_size // 2
    wal[at] ^= 0xFF
    wal_path.write_bytes(bytes(wal))


def names_sqlite_keeps(db: Path, tmp: Path) -> set[str]:
    """What SQLite itself makes of the damaged files: read from copies, so this look
    changes nothing the daemon will find."""
    copy = tmp / "look.db"
    shutil.copy(db, copy)
    shutil.copy(f"{db}-wal", f"{copy}-wal")
    conn = sqlite3.connect(copy)
    try:
        return {row[0] for row in conn.execute("SELECT name FROM jobs")}
    finally:
        conn.close()


def job_ids(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT name, id FROM jobs"))
    finally:
        conn.close()


def events_of(client: Any, name: str, project: str) -> list[dict[str, Any]]:
    raw = b"".join(client.events(job=name, project=project))
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def test_a_flipped_byte_in_the_wal_loses_no_finished_job(lab: Lab, tmp_path: Path) -> None:
    d = testing.Daemon(cpus=4, memory="8GiB")
    try:
        d.start()
        root = d.client()
        mine = [(f"root-{i}", 3 if i % 4 == 1 else 0) for i in range(20)]
        for name, code in mine:
            root.create_job({"name": name, "project": "wal", "cpu": 0.1,
                             "labels": {"n": name},
                             "command": ["/bin/sh", "-c", f"echo out-{name}; exit {code}"]})
        theirs = [(f"user-{i}", 5 if i % 3 == 2 else 0) for i in range(10)]
        made = lab.run(d, SYSTEM_PYTHON, "-c", USER_JOBS, str(d.socket), json.dumps(theirs))
        assert made.returncode == 0, made.stderr
        for name, _ in mine:
            root.wait_job(name, "wal", timeout=DEADLINE)
        before = {(job["project"], job["name"]): job for job in root.list_jobs(all=True)}
        assert len(before) == 30
        ids = job_ids(d.data_dir / "noduslocal.db")
        d.kill()

        db = d.data_dir / "noduslocal.db"
        flip_middle_frame(db)
        kept = names_sqlite_keeps(db, tmp_path)
        lost = {key for key in before if key[1] not in kept}
        assert lost and len(lost) < 30, f"the flip lost {len(lost)} of 30 jobs"

        d.start()
        after = {(job["project"], job["name"]): job for job in root.list_jobs(all=True)}
        assert set(after) == set(before), f"missing: {sorted(set(before) - set(after))}"
        for key, job in before.items():
            # A job whose start the database lost is put back Starting, then its attempt's
            # exit settles it, a moment after the daemon serves (failed in CI, 1 run in 10).
            back = root.wait_job(key[1], key[0], timeout=DEADLINE)
            for field in ("owner", "uid", "phase", "exit_code", "labels", "created_at",
                          "attempts"):
                assert back[field] == job[field], (key, field, back, job)
            assert back["spec"]["command"] == job["spec"]["command"]
            assert b"".join(root.logs(key[1], key[0])).decode() == f"out-{key[1]}\n"
        for project, name in lost:
            recovered = events_of(root, name, project)[-1]
            assert "recovered from its directory" in recovered["message"], recovered
            assert root.attempts(name, project)[0]["phase"] == "Exited"

        # No new job reuses a recovered job's id (nor its directory).
        new = root.create_job({"name": "after", "project": "wal", "command": ["true"]})
        assert root.wait_job(new["name"], "wal", timeout=DEADLINE)["phase"] == "Succeeded"
        assert job_ids(db)["after"] > max(ids.values())

        # Said loudly: the log, health, and doctor for a user who is no admin.
        errors = [line for line in d.log().splitlines()
                  if " ERROR " in line and "lost" in line]
        assert errors and f"{len(lost)} job" in errors[-1], d.log()[-3000:]
        health = root.transport.request("GET", "/v1/health")
        assert health["status"] == "degraded", health
        assert any(f"{len(lost)} job" in p and "recovered" in p
                   for p in health["problems"]), health
        found = lab.doctor(d)
        check = found["lost jobs"]
        assert check["ok"] is False, check
        assert f"{len(lost)} job" in check["detail"], check
        assert str(d.data_dir) not in check["detail"], check  # no other users' paths
        assert found["health"]["ok"] is False, found["health"]
    finally:
        d.close()


def test_a_directory_with_an_exit_record_is_never_said_to_have_run_nothing(
        lab: Lab) -> None:
    """A lost job whose directory has no record of the job (made before the daemon wrote
    one) is kept aside: the log says it holds an exit record, and doctor says how to
    restore it, to its user too."""
    d = testing.Daemon(cpus=2, memory="4GiB")
    try:
        d.start()
        client = d.client()
        client.wait_job(client.create_job({"name": "kept", "command": ["true"]})["name"],
                        timeout=DEADLINE)
        db = d.data_dir / "noduslocal.db"
        d.stop()
        saved = db.read_bytes()  # the database before the job it will forget
        d.start()
        client.create_job({"name": "forgotten", "command": ["sh", "-c", "echo done"]})
        client.wait_job("forgotten", timeout=DEADLINE)
        directory = d.data_dir / "jobs" / str(job_ids(db)["forgotten"])
        d.kill()
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        db.write_bytes(saved)
        # As a directory from before the record: neither its attribute nor its file.
        with contextlib.suppress(OSError):
            os.removexattr(directory, RECORD_XATTR)
        with contextlib.suppress(FileNotFoundError):
            (directory / RECORD).unlink()
        assert (directory / "attempt-1" / "exit.json").exists()

        d.start()
        lines = [line for line in d.log().splitlines() if str(directory) in line]
        assert lines, d.log()[-3000:]
        assert not any("nothing ran" in line for line in lines), lines
        assert any("exit record" in line for line in lines), lines
        health = d.client().transport.request("GET", "/v1/health")
        assert health["status"] == "degraded", health
        found = lab.doctor(d)
        assert found["lost jobs"]["ok"] is False
        assert "admin" in found["lost jobs"]["detail"]
        assert str(directory) not in found["lost jobs"]["detail"]
        admin = {c["name"]: c for c in json.loads(subprocess.run(
            [sys.executable, "-m", "noduslocal.cli", "doctor", "--json"],
            capture_output=True, text=True, timeout=DEADLINE,
            env={**os.environ, SOCKET_ENV: str(d.socket)}).stdout)}
        detail = admin["lost jobs"]["detail"]
        assert str(directory) in detail and "docs/admin.md" in detail, detail
    finally:
        d.close()


@pytest.mark.parametrize("rebooted", [False, True], ids=["damage", "power-loss"])
def test_a_job_whose_start_the_database_lost_is_not_run_again(
        lab: Lab, tmp_path: Path, rebooted: bool) -> None:
    """The database kept the job's creation but lost its start: its directory proves the
    attempt ran and how it ended, so it is not started again (before: StartFailed, "File
    exists"), and its end is the one its exit record says. In the same boot that is a
    damaged database (health says so); after the machine stopped under the daemon it is
    what a power loss does to the commits of the last second (store/writer.py): said in
    the log, and no damage."""
    d = testing.Daemon(cpus=1, memory="4GiB")
    release, ran = tmp_path / "release", tmp_path / "ran"
    try:
        d.start()
        client = d.client()
        client.create_job({"name": "blocker", "cpu": 1, "command": [
            "/bin/sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"]})
        testing.wait_until(lambda: client.get_job("blocker")["phase"] == "Running",
                           "the blocker to run")
        client.create_job({"name": "queued", "cpu": 1, "command": [
            "/bin/sh", "-c", f"echo once >> {ran}; echo out; exit 4"]})
        assert client.get_job("queued")["phase"] == "Pending"
        db = d.data_dir / "noduslocal.db"
        saved = tmp_path / "saved.db"
        source, copy = sqlite3.connect(db), sqlite3.connect(saved)
        source.backup(copy)  # the database as it was before the queued job started
        copy.close()
        source.close()
        release.touch()
        assert client.wait_job("queued", timeout=DEADLINE)["exit_code"] == 4
        d.kill()
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        shutil.copy(saved, db)
        if rebooted:  # the boot the last daemon started in was another
            (d.data_dir / "boot_id").write_text("a-boot-before-the-power-loss\n")

        d.start()
        job = client.wait_job("queued", timeout=DEADLINE)
        assert (job["phase"], job["exit_code"], job["attempts"]) == ("Failed", 4, 1), job
        assert b"".join(client.logs("queued")).decode() == "out\n"
        assert ran.read_text() == "once\n"
        assert client.wait_job("blocker", timeout=DEADLINE)["phase"] == "Succeeded"
        assert any("recovered from its directory" in (e["message"] or "")
                   for e in events_of(client, "queued", job["project"]))
        health = client.transport.request("GET", "/v1/health")
        lines = d.log().splitlines()
        found = lab.doctor(d)["lost jobs"]
        if rebooted:
            assert not any("starts of" in p for p in health["problems"]), health
            assert any(" WARNING " in line and "power loss" in line
                       and "starts of 1 job" in line for line in lines), d.log()[-3000:]
            assert not any(" ERROR " in line and "starts of" in line for line in lines)
            assert found["ok"] is True and "power loss" in found["detail"], found
        else:
            assert any("starts of 1 job" in p for p in health["problems"]), health
            assert any(" ERROR " in line and "starts of 1 job" in line
                       for line in lines), d.log()[-3000:]
            assert found["ok"] is False and "damaged or cut WAL" in found["detail"], found
    finally:
        d.close()


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
