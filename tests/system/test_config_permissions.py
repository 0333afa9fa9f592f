"""The daemon takes a config only root and its own user can change: a file, or a directory
above it, that another user could write is refused at start (a one-line reason, exit 2)
and at each reload (the daemon keeps what it had, says why in its log, and `doctor`'s
config check shows it). The review made herself admin through a mode-666 config.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from noduslocal import testing
from noduslocal.domain import errors
from tests.conftest import run_cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")

NOBODY = 65534  # Debian's nobody and nogroup: no group of root's


def start(config: Path, root: Path) -> subprocess.CompletedProcess[str]:
    """noduslocald with CONFIG, until it exits (refused: its status and stderr) or answers
    on its socket (taken: status 0, then it is stopped)."""
    (root / "d").mkdir(mode=0o711)
    d = testing.Daemon(root / "d", cpus=1, memory="1GiB")
    argv = [*d.command(), "--config", str(config)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        client = d.client()
        deadline = time.monotonic() + 30
        while proc.poll() is None:
            with contextlib.suppress(errors.DaemonUnavailable):
                client.transport.request("GET", "/v1/health", timeout=2)
                return subprocess.CompletedProcess(argv, 0, "", "")
            assert time.monotonic() < deadline, "the daemon neither answered nor exited"
            time.sleep(0.05)
        return subprocess.CompletedProcess(argv, proc.returncode, "", proc.stderr.read())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        d.close()


def world_writable_file(config: Path) -> Path:
    config.chmod(0o666)
    return config


def group_writable_by_others(config: Path) -> Path:
    os.chown(config, 0, NOBODY)
    config.chmod(0o664)
    return config


def owned_by_another_user(config: Path) -> Path:
    os.chown(config, NOBODY, 0)
    return config


def in_a_world_writable_directory(config: Path) -> Path:
    config.parent.chmod(0o777)
    return config


def in_a_directory_of_another_user(config: Path) -> Path:
    os.chown(config.parent, NOBODY, 0)
    return config


def linked_from_a_safe_place(config: Path) -> Path:
    """The name is in a safe directory, the file it links to in an unsafe one."""
    config.parent.chmod(0o777)
    safe = config.parent.parent / "safe"
    safe.mkdir(mode=0o755)
    (safe / "config.toml").symlink_to(config)
    return safe / "config.toml"


UNSAFE: list[tuple[Callable[[Path], Path], str]] = [
    (world_writable_file, "every user"),
    (group_writable_by_others, "the group 'nogroup'"),
    (owned_by_another_user, "its owner nobody"),
    (in_a_world_writable_directory, "every user"),
    (in_a_directory_of_another_user, "its owner nobody"),
    (linked_from_a_safe_place, "every user"),
]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    etc = tmp_path / "etc"
    etc.mkdir(mode=0o755)
    path = etc / "config.toml"
    path.write_text("user_max_jobs = 1\n")
    path.chmod(0o644)
    return path


@pytest.mark.parametrize("make, who", UNSAFE, ids=[m.__name__ for m, _ in UNSAFE])
def test_the_daemon_refuses_to_start_with_a_config_others_can_change(
        config: Path, tmp_path: Path, make: Callable[[Path], Path], who: str) -> None:
    result = start(make(config), tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("noduslocald: config: "), lines[0]
    assert who in lines[0] and "admin" in lines[0] and "chmod go-w" in lines[0], lines[0]


@pytest.mark.parametrize("make", [
    lambda config: config,
    lambda config: (config.parent.chmod(0o1777), config)[1],  # sticky, as /tmp
], ids=["root's alone", "in a sticky directory"])
def test_a_config_only_root_can_change_is_taken(config: Path, tmp_path: Path,
                                                make: Callable[[Path], Path]) -> None:
    result = start(make(config), tmp_path)
    assert result.returncode == 0, result.stderr


# --- while it runs ----------------------------------------------------------------------------


@pytest.fixture
def running(lab_groups: None) -> Iterator[testing.Daemon]:
    d = testing.Daemon(cpus=4, memory="4GiB", config="user_max_jobs = 1\n")
    try:
        assert d.config_path is not None
        d.config_path.chmod(0o644)
        yield d.start()
    finally:
        d.close()


def config_line(d: testing.Daemon) -> tuple[int, str]:
    result = run_cli(d, "doctor")
    lines = [line for line in result.stdout.splitlines() if " config: " in line]
    return result.returncode, lines[0] if lines else result.stdout + result.stderr


def test_a_config_made_writable_is_not_reloaded(running: testing.Daemon) -> None:
    """mallory's way: the file is mode 666, she writes into it; the daemon keeps the
    settings it had until the file is root's alone again."""
    d = running
    client = d.client()
    assert d.config_path is not None
    for name in ("one", "two"):
        client.create_job({"name": name, "command": ["sleep", "60"], "cpu": 0.1})
    testing.wait_until(lambda: client.get_job("one")["phase"] == "Running", "one runs")
    d.config_path.chmod(0o666)
    with open(d.config_path, "w") as file:  # written in place, as she can
        file.write("user_max_jobs = 5\n")
    testing.wait_until(lambda: config_line(d)[0] == 1, "doctor fails the config",
                       timeout=15)
    line = config_line(d)[1]
    assert line.startswith("FAIL config: config: "), line
    assert "every user" in line and "keeps the settings it had" in line, line
    assert "can be changed by every user" in d.log()
    info = client.info()
    assert "every user" in (info["config"]["error"] or ""), info["config"]
    assert client.get_job("two")["phase"] == "Pending"  # user_max_jobs = 5 not applied
    d.config_path.chmod(0o644)  # the admin's fix: read again, and taken
    testing.wait_until(lambda: client.get_job("two")["phase"] == "Running", "two runs",
                       timeout=15)
    assert config_line(d)[0] == 0, config_line(d)
    assert d.proc is not None and d.proc.poll() is None
