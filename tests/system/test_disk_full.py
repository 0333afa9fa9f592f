"""Issue 10, item 5: a full disk never wedges the daemon. Below its reserve new work is
refused naming the disk and what fills it, health says degraded, the job that fills the
database's disk is stopped first, and an end the disk had no room for is committed once
there is. Real daemons on small tmpfs mounts (root only).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from noduslocal import testing
from noduslocal.daemon.store import Store
from noduslocal.domain import errors
from noduslocal.testing import wait_until
from tests.conftest import BUSYBOX


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    if os.getuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the disk tests mount a tmpfs and need root")
        pytest.skip("needs root to mount a tmpfs")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0711", "tmpfs",
                    str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        # What a daemon's close() left because it was mounted then (rmtree cannot remove a
        # mount point): the empty directory, and its parent when nothing else is left in it
        # (six directories in /tmp after each CI run).
        with suppress(OSError):
            path.rmdir()
            path.parent.rmdir()


def health(d: testing.Daemon) -> dict[str, Any]:
    return d.client().transport.request("GET", "/v1/health")  # type: ignore[no-any-return]


def fill_disk(path: Path) -> None:
    """Write zeros at `path` until its file system has no room left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 16, 4096, 512):
            block = bytes(size)
            try:
                while True:
                    os.write(fd, block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_a_low_disk_refuses_new_work_and_stops_the_job_filling_it() -> None:
    d = testing.Daemon(cpus=2, memory="4GiB",
                       config='disk_reserve = "24MiB"\ndisk_poll = 0.2\n')
    with tmpfs(d.data_dir, "64m"):
        try:
            d.start()
            client = d.client()
            assert health(d)["status"] == "ok"
            fill = ("i=0; while [ $i -lt 70 ]; do head -c 1048576 /dev/zero >> fill || "
                    "exit 1; i=$((i+1)); sleep 0.1; done")
            client.create_job({"name": "filler", "command": ["sh", "-c", fill],
                               "cpu": "100m"})
            client.create_job({"name": "quiet", "command": ["sleep", "120"], "cpu": "100m"})
            wait_until(lambda: health(d)["status"] == "degraded", "the disk runs low")
            problems = " ".join(health(d)["problems"])
            assert str(d.data_dir) in problems and "below its reserve" in problems
            with pytest.raises(errors.ResourceExhausted) as refused:
                client.create_job({"name": "late", "command": ["true"], "cpu": "100m"})
            message = str(refused.value)
            assert "disk_reserve" in message and "'filler'" in message, message
            with pytest.raises(errors.NotFound):
                client.get_job("late")  # nothing half-made
            ended = client.wait_job("filler", timeout=60)
            assert (ended["phase"], ended["reason"]) == ("Failed", "DiskFull"), ended
            assert client.get_job("quiet")["phase"] == "Running"
            # Room again: new work is taken.
            for path in (d.data_dir / "jobs").glob("*/workspace/fill"):
                path.unlink()
            wait_until(lambda: health(d)["status"] == "ok", "the disk has room again")
            client.create_job({"name": "late", "command": ["true"], "cpu": "100m"})
            assert client.wait_job("late", timeout=30)["phase"] == "Succeeded"
            client.cancel_job("quiet")
        finally:
            d.close()


def test_an_end_the_full_disk_kept_out_is_committed_once_there_is_room(
        tmp_path: Path) -> None:
    """The job stayed Running until a restart and its attached CLI hung for 24 minutes."""
    gate = tmp_path / "gate"
    d = testing.Daemon(cpus=2, memory="4GiB",
                       config='disk_reserve = "1MiB"\ndisk_poll = 0.2\n')
    with tmpfs(d.data_dir, "32m"), tmpfs(d.data_dir / "jobs", "64m"):
        try:
            d.start()
            client = d.client()
            client.create_job({"name": "ender", "cpu": "100m", "command": [
                "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]})
            wait_until(lambda: client.get_job("ender")["phase"] == "Running", "it runs")
            filler = d.data_dir / "filler"
            fill_disk(filler)
            gate.touch()
            wait_until(lambda: any("cannot commit" in p for p in health(d)["problems"]),
                       "the end waits for room")
            assert client.get_job("ender")["phase"] == "Running"
            # The workspaces' own disk is not the database's: nobody is stopped for it.
            assert "DiskFull" not in d.log()
            filler.unlink()
            ended = client.wait_job("ender", timeout=60)
            assert (ended["phase"], ended["exit_code"]) == ("Succeeded", 0)
            wait_until(lambda: health(d)["status"] == "ok", "healthy again")
            # Nothing was lost or doubled: one attempt, and the daemon restarts clean.
            assert len(client.attempts("ender")) == 1
            d.restart()
            assert d.client().get_job("ender")["phase"] == "Succeeded"
        finally:
            d.close()


def job_pid(d: testing.Daemon, word: str) -> int | None:
    """The pid of the running job whose command line holds `word` (from its pid.json)."""
    for pid_file in d.data_dir.glob("jobs/*/attempt-*/pid.json"):
        try:
            pid = json.loads(pid_file.read_text())["pid"]
            if word.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
        except (OSError, ValueError, KeyError):
            continue
    return None


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_job_that_keeps_filling_the_disk_is_stopped_while_the_disk_stays_full() -> None:
    """`yes` into its own log on the data dir's disk: the stop was logged, yet the job ran
    on and `job kill` answered while the process lived, because each stop waited for a
    commit that the job's output kept from landing."""
    d = testing.Daemon(cpus=2, memory="4GiB",
                       config='disk_reserve = "8MiB"\ndisk_poll = 0.2\nkill_grace = "2s"\n')
    with tmpfs(d.data_dir, "64m"):
        try:
            ballast = d.data_dir / "ballast"  # what we give back once the job is stopped
            ballast.write_bytes(bytes(16 << 20))
            d.start()
            client = d.client()
            client.create_job({"name": "quiet", "command": ["sleep", "3001"], "cpu": "100m"})
            quiet = wait_until(lambda: job_pid(d, "3001"), "the quiet job runs")
            client.create_job({"name": "filler", "cpu": "100m",
                               "command": ["yes", "filler-" + "A" * 60]})
            filler = wait_until(lambda: job_pid(d, "filler-"), "the filler runs")
            # Stopped with the disk still full: its log keeps the space.
            wait_until(lambda: testing.process_gone(filler), "the filler to be stopped",
                       timeout=60)
            assert free_bytes(d.data_dir) < (4 << 20), free_bytes(d.data_dir)
            assert "stopping job filler" in d.log()
            # The disk stays full, read again and again: a job that does not grow is not
            # stopped for what the filler left (each was, one per reading).
            time.sleep(20 * 0.2)
            assert not testing.process_gone(quiet) and "stopping job quiet" not in d.log()
            # The owner's kill reaches a job while the disk is full.
            client.cancel_job("quiet")
            wait_until(lambda: testing.process_gone(quiet), "the killed job to end",
                       timeout=60)
            assert free_bytes(d.data_dir) < (4 << 20), free_bytes(d.data_dir)
            # Room again: what waited is recorded, and the daemon takes new work.
            ballast.unlink()
            ended = client.wait_job("filler", timeout=60)
            assert (ended["phase"], ended["reason"]) == ("Failed", "DiskFull"), ended
            assert client.wait_job("quiet", timeout=60)["phase"] == "Cancelled"
            wait_until(lambda: health(d)["status"] == "ok", "healthy again", timeout=60)
            client.create_job({"name": "late", "command": ["true"], "cpu": "100m"})
            assert client.wait_job("late", timeout=30)["phase"] == "Succeeded"
            d.restart()
            client = d.client()
            for name, phase in (("filler", "Failed"), ("quiet", "Cancelled"),
                                ("late", "Succeeded")):
                assert client.get_job(name)["phase"] == phase
                # Each exit recorded by its shim, though the disk had no room for it.
                assert [a["phase"] for a in client.attempts(name)] == ["Exited"], name
        finally:
            d.close()


def test_a_kill_reaches_its_job_while_the_database_cannot_commit() -> None:
    """`job kill` answered "SIGTERM sent" and the process lived on: the signal waited for
    the stop's commit, which the full disk kept out. And a daemon restarted on the full
    disk (systemd's Restart=) exited at once: its start wrote to the database."""
    d = testing.Daemon(cpus=2, memory="4GiB", config='disk_reserve = "1B"\ndisk_poll = 0.2\n')
    with tmpfs(d.data_dir, "32m"):
        try:
            d.start()
            client = d.client()
            client.create_job({"name": "quiet", "command": ["sleep", "3002"], "cpu": "100m"})
            quiet = wait_until(lambda: job_pid(d, "3002"), "the job runs")
            filler = d.data_dir / "filler"
            fill_disk(filler)
            d.restart()  # kill -9, then a start on the full disk
            assert client.get_job("quiet")["phase"] == "Running"
            answers: list[dict[str, Any]] = []
            asking = threading.Thread(target=lambda: answers.append(client.cancel_job("quiet")),
                                      daemon=True)
            asking.start()
            wait_until(lambda: testing.process_gone(quiet), "the killed job to end", timeout=60)
            asking.join(60)
            assert answers and answers[0]["name"] == "quiet", answers
            filler.unlink()
            ended = client.wait_job("quiet", timeout=60)
            assert (ended["phase"], ended["reason"]) == ("Cancelled", "Cancelled"), ended
            wait_until(lambda: health(d)["status"] == "ok", "healthy again")
            d.restart()
            assert d.client().get_job("quiet")["phase"] == "Cancelled"
            assert len(d.client().attempts("quiet")) == 1
        finally:
            d.close()


def test_a_log_past_max_log_bytes_keeps_its_head_a_marker_and_its_end(
        docker_client: Any) -> None:
    """A job printing without end filled the disk with its log: the log is capped, for
    host jobs and containers alike, and a reload applies to the jobs started after it."""
    del docker_client
    d = testing.Daemon(cpus=2, memory="4GiB", config='max_log_bytes = "256KiB"\n')
    try:
        d.start()
        client = d.client()
        for name, extra in (("host", {}), ("box", {"image": BUSYBOX, "memory": "64MiB"})):
            client.create_job({"name": name, "cpu": "100m", **extra, "command": [
                "sh", "-c", f"seq 1 300000; echo last line of {name}"]})
        for name in ("host", "box"):
            assert client.wait_job(name, timeout=60)["phase"] == "Succeeded"
            log = b"".join(client.logs(name))
            assert len(log) <= 256 * 1024, (name, len(log))
            assert log.startswith(b"1\n2\n3\n"), name
            assert b"[noduslocal] this log reached max_log_bytes (262144 bytes)" in log, name
            assert log.endswith(f"299999\n300000\nlast line of {name}\n".encode()), name
        assert d.config_path is not None
        d.config_path.write_text('max_log_bytes = "64KiB"\n')
        wait_until(lambda: "reloaded: max_log_bytes applied" in d.log(), "the reload")
        client.create_job({"name": "later", "cpu": "100m", "command": ["seq", "1", "300000"]})
        assert client.wait_job("later", timeout=60)["phase"] == "Succeeded"
        assert len(b"".join(client.logs("later"))) <= 64 * 1024
    finally:
        d.close()
    bad = testing.Daemon(config='max_log_bytes = "1KiB"\n')
    try:
        with pytest.raises(RuntimeError, match="max_log_bytes: expected a size from 64KiB"):
            bad.start()
    finally:
        bad.close()


SHM_BOUNDARY = 4062 + 4096  # WAL frames the first two 32 KiB regions of the -shm index hold


def _scratch(conn: sqlite3.Connection) -> tuple[None, list[Any]]:
    conn.execute("CREATE TABLE scratch (x)")
    return None, []


def _insert(conn: sqlite3.Connection) -> tuple[None, list[Any]]:
    conn.execute("INSERT INTO scratch VALUES (?)", ("x" * 3000,))  # one page, one frame
    return None, []


def test_a_commit_the_wal_index_has_no_room_for_waits_and_lands(tmp_path: Path) -> None:
    """A full disk that stops the WAL's index (the -shm file) from growing says
    SQLITE_IOERR_SHMSIZE, not SQLITE_FULL: the writer failed the batch (an end lost)
    instead of keeping it for when there is room."""
    with tmpfs(tmp_path / "disk", "64m") as disk:
        path = disk / "noduslocal.db"

        def frames() -> int:
            return (os.path.getsize(f"{path}-wal") - 32) // (4096 + 24)

        async def body() -> int:
            store = Store(path)
            await store.open(lambda events: None)
            try:
                await store.write(_scratch)
                # A reader's snapshot keeps checkpoints from restarting the WAL: it grows.
                held = sqlite3.connect(path, isolation_level=None)
                held.execute("BEGIN")
                held.execute("SELECT count(*) FROM scratch").fetchall()
                written = 0
                while frames() < SHM_BOUNDARY - 3:
                    await store.write(_insert)
                    written += 1
                filler = disk / "filler"
                fill_disk(filler)
                with open(filler, "r+b") as file:  # room for a few frames, not the index
                    file.truncate(os.path.getsize(filler) - 7 * 4096)
                stalled = None
                for _ in range(20):
                    op = store.write(_insert)
                    while not op.done() and store.commits_stalled() is None:
                        await asyncio.sleep(0.01)
                    if not op.done():
                        stalled = op
                        break
                    await op
                    written += 1
                assert stalled is not None and store.commits_stalled() is not None
                held.close()
                filler.unlink()
                await asyncio.wait_for(stalled, 30)  # once there is room, it lands
                rows = await store.fetchall("SELECT count(*) FROM scratch")
                assert rows[0][0] == written + 1
                return written
            finally:
                await store.close()

        asyncio.run(body())


def test_a_job_waits_for_disk_that_running_jobs_reserved() -> None:
    d = testing.Daemon(cpus=2, memory="4GiB", config='disk_reserve = "8MiB"\ndisk_poll = 0.2\n')
    with tmpfs(d.data_dir, "64m"):
        try:
            d.start()
            client = d.client()
            client.create_job({"name": "first", "command": ["sleep", "60"], "cpu": "100m",
                               "disk": "40MiB"})
            wait_until(lambda: client.get_job("first")["phase"] == "Running", "first runs")
            client.create_job({"name": "second", "command": ["true"], "cpu": "100m",
                               "disk": "40MiB"})
            wait_until(lambda: "disk" in (client.get_job("second").get("hold") or ""),
                       "second waits for disk")
            assert client.get_job("second")["phase"] == "Pending"
            # A job without `disk` is not held up behind it.
            client.create_job({"name": "third", "command": ["true"], "cpu": "100m"})
            assert client.wait_job("third", timeout=30)["phase"] == "Succeeded"
            client.cancel_job("first")
            assert client.wait_job("second", timeout=30)["phase"] == "Succeeded"
        finally:
            d.close()
