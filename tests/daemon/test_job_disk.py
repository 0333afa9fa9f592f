"""A job's `disk` (CLI --disk, --min-disk-gb) is reserved from what the daemon's disk has
free above its reserve: one asking more than there is is refused saying what there is, and
one whose directory grows past it ends Failed, DiskExceeded. One that does not fit now
waits saying why: tests/system/test_disk_full.py (a small tmpfs, root).
"""

from __future__ import annotations

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from tests.conftest import run_cli


def test_a_job_that_writes_past_its_disk_ends_disk_exceeded() -> None:
    d = testing.Daemon(cpus=2, memory="4GiB", config='disk_reserve = "1MiB"\ndisk_poll = 0.1\n')
    try:
        d.start()
        client = d.client()
        grow = ("i=0; while [ $i -lt 200 ]; do head -c 1048576 /dev/zero >> big; "
                "i=$((i+1)); sleep 0.05; done")
        client.create_job({"name": "grower", "command": ["sh", "-c", grow], "cpu": "100m",
                           "disk": "8MiB"})
        client.create_job({"name": "small", "command": ["sh", "-c", "echo hi > f; sleep 2"],
                           "cpu": "100m", "disk": "8MiB"})
        ended = client.wait_job("grower", timeout=60)
        assert (ended["phase"], ended["reason"]) == ("Failed", "DiskExceeded"), ended
        assert "past its disk of 8.0 MiB" in ended["message"]
        assert client.wait_job("small", timeout=60)["phase"] == "Succeeded"
    finally:
        d.close()


def test_more_disk_than_there_is_is_refused_saying_what_there_is(
        daemon: testing.Daemon) -> None:
    with pytest.raises(errors.InvalidArgument, match="free above its reserve") as info:
        daemon.client().create_job({"name": "huge", "command": ["true"], "disk": "1000TiB"})
    assert info.value.field == "disk"
    with pytest.raises(errors.InvalidArgument, match="disk: at least 1MiB"):
        daemon.client().create_job({"name": "tiny", "command": ["true"], "disk": 16})
    cli = run_cli(daemon, "job", "run", "--min-disk-gb", "1000000", "--", "true")
    assert cli.returncode == 2 and "disk: " in cli.stderr
    made = run_cli(daemon, "job", "run", "--detach", "--name", "ok", "--min-disk-gb", "1",
                   "--", "true")
    assert made.returncode == 0, made.stderr
    assert daemon.client().get_job("ok")["spec"]["disk"] == 2**30
    sdk = nodus.Job.create(name="sdk", command=["true"], disk="512MiB")
    assert sdk.wait(timeout=30).spec["disk"] == 512 * 2**20
    assert "disk:" in run_cli(daemon, "job", "status", "ok").stdout


