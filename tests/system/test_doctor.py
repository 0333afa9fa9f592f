"""`noduslocal doctor` on a box laid out as scripts/install.sh lays it out: one line per
check (the socket and its mode, the groups, the daemon, dockerd, the host shim, GPUs, disk,
config, clock, health, database), OK or what to do, and exit 1 when something is wrong
(here: a clock behind what the database recorded, an index that disagrees with its table)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from noduslocal import testing
from tests.conftest import run_cli


@pytest.fixture
def installed(lab_groups: None, docker_client: Any) -> Iterator[testing.Daemon]:
    del docker_client  # dockerd is one of the checks
    d = testing.Daemon(cpus=1, memory="1GiB")
    try:
        yield d.start()
    finally:
        d.close()


def checks(d: testing.Daemon) -> tuple[int, dict[str, dict[str, Any]]]:
    result = run_cli(d, "doctor", "--json")
    return result.returncode, {c["name"]: c for c in json.loads(result.stdout)}


def test_a_healthy_box_is_all_ok(installed: testing.Daemon) -> None:
    code, found = checks(installed)
    assert code == 0, found
    for name in ("socket", "daemon", "groups", "host jobs", "dockerd", "disk", "config",
                 "clock", "health", "database", "lost jobs"):
        assert found[name]["ok"] is True, found[name]
    assert found["socket"]["detail"].endswith("0660 root:noduslocal")
    assert found["groups"]["detail"] == "noduslocal and noduslocal-admin exist; you are root"
    assert found["dockerd"]["detail"].startswith("docker ")
    # No GPUs here: the NVIDIA runtime is not needed, and that is no failure.
    assert found["nvidia runtime"]["ok"] is None
    text = run_cli(installed, "doctor").stdout.splitlines()
    assert all(line[:4] in ("OK  ", "--  ") for line in text), text


def test_a_clock_behind_the_database_fails(installed: testing.Daemon) -> None:
    d = installed
    client = d.client()
    client.wait_job(client.create_job({"name": "once", "command": ["true"]})["name"])
    db = sqlite3.connect(d.data_dir / "noduslocal.db", timeout=10)
    with db:  # as if the clock was set back an hour after this job ran
        db.execute("UPDATE events SET at = at + 3600")
    db.close()
    code, found = checks(d)
    assert code == 1
    assert found["clock"]["ok"] is False
    assert "behind the newest event" in found["clock"]["detail"]
    assert "timedatectl" in found["clock"]["detail"]


def test_doctor_checks_the_groups_the_daemon_was_configured_with(docker_client: Any) -> None:
    """A box whose config names other groups: doctor holds the socket and the groups to
    those, not to the defaults (it asked the daemon)."""
    del docker_client
    import os
    import subprocess

    if os.getuid() != 0:
        pytest.skip("making groups needs root")
    groups = ("nl-test-users", "nl-test-admins")
    for group in groups:
        subprocess.run(["groupadd", "-f", group], check=True)
    d = testing.Daemon(cpus=1, memory="1GiB", config='socket_group = "nl-test-users"\n'
                                                     'admin_group = "nl-test-admins"\n')
    try:
        d.start()
        _, found = checks(d)
        assert found["socket"]["ok"] is True, found["socket"]
        assert found["socket"]["detail"].endswith("0660 root:nl-test-users")
        assert found["groups"]["detail"] == \
            "nl-test-users and nl-test-admins exist; you are root"
    finally:
        d.close()
        for group in groups:
            subprocess.run(["groupdel", group], check=False)


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
