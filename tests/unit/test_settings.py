"""The daemon's settings without a daemon: the shipped default config documents every
setting with its default and marks what waits for a restart, each checked setting names
itself when it is wrong (retention, outbound requests, the metrics port, profiles), and a
config written with its new directory is read. Reloads of a running daemon are in
tests/system/test_config_reload.py."""

from __future__ import annotations

import asyncio
import re
import time
import tomllib
from dataclasses import fields
from importlib import resources
from pathlib import Path

import pytest

from noduslocal.daemon.config import reload as config_reload
from noduslocal.daemon.config.reload import ConfigReloader, _line_of
from noduslocal.daemon.config.settings import _TOML_KEYS, LIVE, TOML_NAME, Settings, load_settings
from noduslocal.domain import errors

DEFAULT_CONFIG = resources.files("noduslocal").joinpath("default_config.toml").read_text()


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


def test_retention_settings_parse_and_name_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('keep_ended = "30d"\nuser_disk_quota = "1TiB"\n'
                    '[keep_ended_users]\nci = "1d"\nalice = "forever"\n'
                    '[user_disk_quotas]\nalice = "none"\n')
    settings = load_settings(path, socket=tmp_path / "s", data_dir=tmp_path / "d")
    assert settings.keep_for("bob") == 30 * 86400 and settings.keep_for("ci") == 86400
    assert settings.keep_for("alice") is None
    assert settings.quota_for("bob") == 2**40 and settings.quota_for("alice") is None
    for text, message in (('keep_ended = "soon"', "keep_ended: 'soon' is not a duration"),
                          ('[keep_ended_users]\nbob = "x"', "keep_ended_users.bob:"),
                          ('[user_disk_quotas]\nbob = 0', "user_disk_quotas.bob:"),
                          ('keep_ended_users = 3', "expected a [keep_ended_users] table"),
                          ('gc_every = "30d"', "gc_every: expected a duration from 1s"),
                          ('[keep_ended_users]\ngc_every = "1h"',
                           "keep_ended_users.gc_every: gc_every is a setting, not a user")):
        path.write_text(text + "\n")
        with pytest.raises(errors.InvalidArgument, match=message.replace("[", r"\[")):
            load_settings(path, socket=tmp_path / "s", data_dir=tmp_path / "d")


def test_the_admin_setting_is_checked_at_start(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    for text, field in (('webhook_local_networks = ["localhost"]', "webhook_local_networks"),
                        ('webhook_local_networks = "127.0.0.1/32"', "webhook_local_networks"),
                        ('local_registries = ["http://127.0.0.1:5000"]', "local_registries"),
                        ("webhook_local_networks = [5]", "webhook_local_networks"),
                        ("local_registries = [5000]", "local_registries")):
        config.write_text(text + "\n")
        with pytest.raises(errors.InvalidArgument) as caught:
            load_settings(config, socket=tmp_path / "s", data_dir=tmp_path / "d")
        assert caught.value.field == field and field in str(caught.value), text
    config.write_text('webhook_local_networks = ["127.0.0.0/8", "::1"]\n'
                      'local_registries = ["127.0.0.1:5000", "localhost"]\n')
    settings = load_settings(config, socket=tmp_path / "s", data_dir=tmp_path / "d")
    assert [str(n) for n in settings.webhook_local_networks] == ["127.0.0.0/8", "::1/128"]
    assert settings.local_registries == ("127.0.0.1:5000", "localhost")


@pytest.mark.parametrize("value", ['"no"', "0", '""'])
def test_the_metrics_port_per_user_setting_is_checked_like_its_siblings(
        tmp_path: Path, value: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f"metrics_port_per_user = {value}\n")
    with pytest.raises(errors.InvalidArgument) as caught:
        load_settings(config)
    assert caught.value.field == "metrics_port_per_user"
    config.write_text("metrics_port_per_user = false\n")
    assert load_settings(config).metrics_port_per_user is False
    assert load_settings(None).metrics_port_per_user is True


@pytest.mark.parametrize(("config", "named"), [
    ('[profiles.bad]\ncpu = "lots"\n', "profiles.bad.cpu"),
    ('[profiles.bad]\ncommand = ["rm"]\n', "profiles.bad.command: not for a profile"),
    ('[profiles.bad]\nregion = "mars"\n', "profiles.bad.region"),
    ('[profiles.Bad_Name]\ncpu = 1\n', "profiles.Bad_Name"),
])
def test_a_bad_profile_is_refused_when_the_config_is_read(tmp_path: object, config: str,
                                                          named: str) -> None:
    path = tmp_path / "config.toml"  # type: ignore[operator]
    path.write_text(config)
    with pytest.raises(errors.InvalidArgument, match=named):
        load_settings(path)
