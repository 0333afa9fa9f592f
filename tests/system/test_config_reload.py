"""Issue 13, item 3: the config file is followed while the daemon runs. A good edit (a user
limit) takes effect without a restart; a bad one leaves the daemon on what it had and
`doctor` names the line; a change that needs a restart says so. The shipped default config
documents every setting with its default."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import tomllib
from dataclasses import fields
from importlib import resources
from pathlib import Path

import pytest

from noduslocal import testing
from noduslocal.daemon.config import reload as config_reload
from noduslocal.daemon.config.reload import ConfigReloader, _line_of
from noduslocal.daemon.config.settings import _TOML_KEYS, LIVE, TOML_NAME, Settings, load_settings
from tests.conftest import run_cli

DEFAULT_CONFIG = resources.files("noduslocal").joinpath("default_config.toml").read_text()


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


def test_line_of_finds_keys_and_tables(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("# cpu = 1\ncpus = 2\n[gpu_hour_rates]\nH100 = 1\n[profiles.small]\n"
                    "cpu = \"x\"  # a comment\n")
    assert _line_of(path, "cpus") == 2
    assert _line_of(path, "gpu_hour_rates") == 3
    assert _line_of(path, "profiles.small.cpu") == 6
    assert _line_of(path, "profiles.small") == 5
    assert _line_of(path, "cpu") is None


def test_every_setting_is_in_the_shipped_config() -> None:
    shown = set(re.findall(r"^# (?:e\.g\. )?\[?([a-z_]+)", DEFAULT_CONFIG, re.MULTILINE))
    assert set(_TOML_KEYS) <= shown, sorted(set(_TOML_KEYS) - shown)
    settable = {f.name for f in fields(Settings)}
    assert {attr for attr, _ in _TOML_KEYS.values()} == settable
    assert settable >= LIVE
    assert set(TOML_NAME) == settable


def test_the_shipped_config_marks_what_waits_for_a_restart() -> None:
    top_level = DEFAULT_CONFIG.split("# e.g. [gpu_hour_rates]")[0]
    for line in top_level.splitlines():
        if match := re.match(r"# (?:e\.g\. )?([a-z_]+) = ", line):
            attr = _TOML_KEYS[match.group(1)][0]
            assert line.endswith("  # restart") == (attr not in LIVE), line


def test_the_shipped_defaults_are_the_defaults(tmp_path: Path) -> None:
    """Uncommenting every `# key = value` line changes nothing; the `# e.g.` lines parse."""
    defaults = "\n".join(line[2:] for line in DEFAULT_CONFIG.splitlines()
                         if re.match(r"# [a-z_]+ = ", line))
    path = tmp_path / "defaults.toml"
    path.write_text(defaults)
    assert set(tomllib.loads(defaults)) >= {"kill_grace", "user_max_execs", "disk_reserve"}
    assert load_settings(path, socket=tmp_path / "s", data_dir=tmp_path / "d") == \
        load_settings(None, socket=tmp_path / "s", data_dir=tmp_path / "d")
    examples = "\n".join(line[len("# e.g. "):] for line in DEFAULT_CONFIG.splitlines()
                         if line.startswith("# e.g. "))
    path.write_text(examples.replace("4xH100-80GB", "2xL4"))
    assert load_settings(path).profiles["small"]["memory"] == "8GiB"


def test_a_config_written_with_its_new_directory_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found running the quickstart's daemon: /etc/noduslocal made, and config.toml written
    in it at once, after the daemon started. The watch begins only once the directory is
    there, so the file written before it began must be read then, not at its next edit."""
    monkeypatch.setattr(config_reload, "DIRECTORY_POLL", 0.1)
    path = tmp_path / "etc" / "config.toml"
    applied: list[Settings] = []

    def load() -> Settings:
        return load_settings(path, socket=tmp_path / "s", data_dir=tmp_path / "d")

    start = load_settings(None, socket=tmp_path / "s", data_dir=tmp_path / "d")

    async def scenario() -> None:
        reloader = ConfigReloader(path, load, start, start, applied.append)
        task = asyncio.create_task(reloader.run())
        try:
            await asyncio.sleep(0.5)  # the daemon runs; the directory does not exist yet
            path.parent.mkdir()
            path.write_text("user_max_jobs = 3\n")
            deadline = time.monotonic() + 15
            while not applied and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            task.cancel()

    asyncio.run(scenario())
    assert applied and applied[-1].user_max_jobs == 3
