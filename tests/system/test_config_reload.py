"""The config file is followed while the daemon runs (on a box with the install's groups, so
root): a good edit (a user limit) takes effect without a restart; a bad one leaves the
daemon on what it had and `doctor` names the line; a change that needs a restart says so;
SIGHUP reads the file again. The shipped default config is checked in
tests/unit/test_settings.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from noduslocal import testing
from tests.conftest import run_cli


def edit(path: Path, text: str) -> None:
    """As an editor saves: a new file renamed over the old one."""
    tmp = path.with_name(f".{path.name}.swp")
    tmp.write_text(text)
    os.replace(tmp, path)


def doctor(d: testing.Daemon) -> tuple[int, str]:
    result = run_cli(d, "doctor")
    config = [line for line in result.stdout.splitlines() if " config: " in line]
    return result.returncode, config[0] if config else result.stdout + result.stderr


@pytest.fixture
def limited(lab_groups: None) -> testing.Daemon:
    d = testing.Daemon(cpus=4, memory="4GiB", config="# a lab box\nuser_max_jobs = 1\n")
    try:
        yield d.start()
    finally:
        d.close()


def test_a_good_edit_takes_effect_without_a_restart(limited: testing.Daemon) -> None:
    d = limited
    client = d.client()
    pid = d.proc.pid if d.proc else None
    for name in ("one", "two"):
        client.create_job({"name": name, "command": ["sleep", "60"]})
    testing.wait_until(lambda: client.get_job("one")["phase"] == "Running", "one runs")
    held = client.get_job("two")
    assert (held["phase"], held["hold"]) == ("Pending", "user limit 1/1 running jobs")
    assert d.config_path is not None
    edit(d.config_path, "# a lab box\nuser_max_jobs = 2\n")
    testing.wait_until(lambda: client.get_job("two")["phase"] == "Running", "two runs",
                       timeout=15)
    assert d.proc is not None and d.proc.pid == pid and d.proc.poll() is None
    code, line = doctor(d)
    assert (code, line.split()[0]) == (0, "OK"), line
    assert "in force" in line
    assert "reloaded: user_max_jobs applied" in d.log()


def test_a_bad_edit_keeps_the_old_config_and_doctor_names_the_line(
        limited: testing.Daemon) -> None:
    d = limited
    client = d.client()
    assert d.config_path is not None
    edit(d.config_path, "# a lab box\nuser_max_jobs = 2\nkill_grace = 5\n"
                        "user_max_gpus = \"many\"\n")
    testing.wait_until(lambda: doctor(d)[0] == 1, "doctor sees the bad line", timeout=15)
    line = doctor(d)[1]
    assert line.startswith("FAIL config: user_max_gpus"), line
    assert "(at line 4 of" in line and "keeps the settings it had" in line
    for name in ("one", "two"):  # still one job at a time: nothing of the bad file applied
        client.create_job({"name": name, "command": ["sleep", "60"]})
    testing.wait_until(lambda: client.get_job("one")["phase"] == "Running", "one runs")
    assert client.get_job("two")["phase"] == "Pending"
    edit(d.config_path, "user_max_jobs = = 2\n")  # not TOML at all
    testing.wait_until(lambda: "(at line 1" in doctor(d)[1], "doctor sees the syntax error",
                       timeout=15)
    edit(d.config_path, "user_max_jobs = 2\n")
    testing.wait_until(lambda: client.get_job("two")["phase"] == "Running", "two runs",
                       timeout=15)
    assert doctor(d)[0] == 0


def test_a_change_that_needs_a_restart_says_so(limited: testing.Daemon) -> None:
    d = limited
    assert d.config_path is not None
    edit(d.config_path, "user_max_jobs = 1\ncommit_batch = 16\n")
    testing.wait_until(lambda: "commit_batch changed" in doctor(d)[1], "doctor says it",
                       timeout=15)
    code, line = doctor(d)
    assert code == 0 and "when the daemon restarts" in line, line
    assert "commit_batch changed; that takes effect when the daemon restarts" in d.log()
    edit(d.config_path, "user_max_jobs = 1\n")  # undone: nothing waits any more
    testing.wait_until(lambda: "changed" not in doctor(d)[1], "doctor forgets it", timeout=15)


def test_sighup_reads_the_file_again(limited: testing.Daemon) -> None:
    d = limited
    assert d.config_path is not None and d.proc is not None
    client = d.client()
    for name in ("one", "two"):
        client.create_job({"name": name, "command": ["sleep", "60"]})
    testing.wait_until(lambda: client.get_job("one")["phase"] == "Running", "one runs")
    # Written in place, with the daemon told by SIGHUP as `systemctl reload` does.
    d.config_path.write_text("user_max_jobs = 3\n")
    os.kill(d.proc.pid, signal.SIGHUP)
    testing.wait_until(lambda: client.get_job("two")["phase"] == "Running", "two runs",
                       timeout=15)
    assert d.proc.poll() is None


