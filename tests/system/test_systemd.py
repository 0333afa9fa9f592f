"""The systemd side of an install: every unit passes `systemd-analyze verify`, the sysusers
and tmpfiles fragments make what they say, and the daemon started by socket activation
(`systemd-socket-activate`, as noduslocal.socket does it) is started by a client's first
call, answers on the passed socket, and tells a notify socket READY=1, its STATUS and the
watchdog's keep-alives."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from noduslocal import testing
from tests.conftest import run_cli

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"
DAEMON = Path(sys.executable).parent / "noduslocald"
DEADLINE = 30.0


def needs(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        message = f"{tool} is needed (Debian: apt-get install systemd)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def installed_units(tmp_path: Path, *names: str) -> list[Path]:
    """The units as install.sh writes them: ExecStart names the daemon it installed."""
    out = []
    for name in names:
        text = (UNITS / name).read_text().replace("/opt/noduslocal/bin/noduslocald",
                                                  str(DAEMON))
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        out.append(target)
    return out


def test_system_units_verify(tmp_path: Path) -> None:
    tool = needs("systemd-analyze")
    units = installed_units(tmp_path, "noduslocal.service", "noduslocal.socket")
    result = subprocess.run([tool, "verify", "--man=no", *map(str, units)],
                            capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_user_units_verify(tmp_path: Path) -> None:
    tool = needs("systemd-analyze")
    units = installed_units(tmp_path, "user/noduslocal.service", "user/noduslocal.socket")
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    result = subprocess.run([tool, "--user", "verify", "--man=no", *map(str, units)],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_a_misspelt_directive_is_caught(tmp_path: Path) -> None:
    """What the two tests above rest on: verify's warnings fail them."""
    tool = needs("systemd-analyze")
    (unit,) = installed_units(tmp_path, "noduslocal.service")
    unit.write_text(unit.read_text().replace("KillMode=process", "KillMode=process\nKilMode=x"))
    result = subprocess.run([tool, "verify", "--man=no", str(unit)], capture_output=True,
                            text=True, timeout=120)
    assert "Unknown key" in result.stdout + result.stderr


def test_the_service_keeps_jobs_across_a_restart_and_is_notify() -> None:
    text = (UNITS / "noduslocal.service").read_text()
    for line in ("Type=notify", "KillMode=process", "Restart=on-failure",
                 "Requires=noduslocal.socket"):
        assert line in text.splitlines(), line
    assert any(line.startswith("WatchdogSec=") for line in text.splitlines())
    socket_unit = (UNITS / "noduslocal.socket").read_text().splitlines()
    for line in ("ListenStream=/run/noduslocal/api.sock", "SocketMode=0660",
                 "SocketGroup=noduslocal"):
        assert line in socket_unit, line


def test_sysusers_and_tmpfiles_make_the_groups_and_directories(tmp_path: Path) -> None:
    sysusers, tmpfiles = needs("systemd-sysusers"), needs("systemd-tmpfiles")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    done = subprocess.run([sysusers, f"--root={root}", str(UNITS / "noduslocal.sysusers")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    groups = {line.split(":")[0] for line in (root / "etc/group").read_text().splitlines()}
    assert {"noduslocal", "noduslocal-admin"} <= groups
    done = subprocess.run([tmpfiles, f"--root={root}", "--create",
                           str(UNITS / "noduslocal.tmpfiles")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert oct((root / "var/lib/noduslocal").stat().st_mode & 0o777) == oct(0o711)
    assert (root / "run/noduslocal").is_dir()


class Notifications:
    """A notify socket, as systemd's: what the daemon says, message by message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(DEADLINE)
        self.seen: list[str] = []

    def until(self, predicate: str) -> list[str]:
        """Messages up to the first that holds the line PREDICATE."""
        while True:
            message = self.sock.recv(4096).decode()
            self.seen.append(message)
            if predicate in message.split("\n"):
                return self.seen


@pytest.fixture
def activated() -> Iterator[tuple[testing.Daemon, subprocess.Popen[bytes], Notifications]]:
    """systemd-socket-activate listening on the daemon's socket with a notify socket and a
    one-second watchdog, as systemd runs noduslocal.socket and noduslocal.service."""
    tool = needs("systemd-socket-activate")
    d = testing.Daemon(cpus=2, memory="4GiB")
    notes = Notifications(d.root / "notify.sock")
    log = open(d.log_path, "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [tool, "-l", str(d.socket), "-E", f"NOTIFY_SOCKET={notes.path}",
         "-E", "WATCHDOG_USEC=1000000", *d.command()],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + DEADLINE
        while not d.socket.exists():
            assert proc.poll() is None, d.log()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield d, proc, notes
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        notes.sock.close()
        d.close()


def test_the_first_call_starts_the_daemon_on_the_passed_socket(
        activated: tuple[testing.Daemon, subprocess.Popen[bytes], Notifications]) -> None:
    d, proc, notes = activated
    notes.sock.settimeout(0.5)
    with pytest.raises(TimeoutError):  # nothing runs until somebody calls
        notes.sock.recv(4096)
    notes.sock.settimeout(DEADLINE)
    first = run_cli(d, "job", "list", timeout=DEADLINE * 2)
    assert first.returncode == 0, first.stderr + d.log()
    assert first.stdout.split()[:4] == ["NAME", "PROJECT", "OWNER", "PHASE"]
    said = notes.until("READY=1")
    assert said[0] == "STATUS=opening the database"
    assert said[-1] == f"READY=1\nSTATUS=serving on {d.socket}"
    assert notes.until("WATCHDOG=1")[-1] == "WATCHDOG=1"
    made = run_cli(d, "job", "run", "--name", "activated", "--", "echo", "hi")
    assert (made.returncode, made.stdout) == (0, "hi\n"), made.stderr
    assert "activated" in run_cli(d, "job", "list", "-a").stdout
    os.killpg(proc.pid, signal.SIGTERM)
    assert notes.until("STOPPING=1")[-1].startswith("STOPPING=1\nSTATUS=stopping")
    proc.wait(timeout=20)
    assert d.socket.exists(), "systemd's socket is systemd's: the daemon leaves it"
