"""Issue 10, item 5: a full disk never wedges the daemon. Below its reserve new work is
refused naming the disk and what fills it, health says degraded, the job that fills the
database's disk is stopped first, and an end the disk had no room for is committed once
there is. Real daemons on small tmpfs mounts (root only).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from noduslocal import errors, testing
from noduslocal.testing import wait_until


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


def _health(d: testing.Daemon) -> dict[str, Any]:
    return d.client().transport.request("GET", "/v1/health")  # type: ignore[no-any-return]


def _fill(path: Path) -> None:
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
            assert _health(d)["status"] == "ok"
            fill = ("i=0; while [ $i -lt 70 ]; do head -c 1048576 /dev/zero >> fill || "
                    "exit 1; i=$((i+1)); sleep 0.1; done")
            client.create_job({"name": "filler", "command": ["sh", "-c", fill],
                               "cpu": "100m"})
            client.create_job({"name": "quiet", "command": ["sleep", "120"], "cpu": "100m"})
            wait_until(lambda: _health(d)["status"] == "degraded", "the disk runs low")
            problems = " ".join(_health(d)["problems"])
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
            wait_until(lambda: _health(d)["status"] == "ok", "the disk has room again")
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
            _fill(filler)
            gate.touch()
            wait_until(lambda: any("cannot commit" in p for p in _health(d)["problems"]),
                       "the end waits for room")
            assert client.get_job("ender")["phase"] == "Running"
            # The workspaces' own disk is not the database's: nobody is stopped for it.
            assert "DiskFull" not in d.log()
            filler.unlink()
            ended = client.wait_job("ender", timeout=60)
            assert (ended["phase"], ended["exit_code"]) == ("Succeeded", 0)
            wait_until(lambda: _health(d)["status"] == "ok", "healthy again")
            # Nothing was lost or doubled: one attempt, and the daemon restarts clean.
            assert len(client.attempts("ender")) == 1
            d.restart()
            assert d.client().get_job("ender")["phase"] == "Succeeded"
        finally:
            d.close()
