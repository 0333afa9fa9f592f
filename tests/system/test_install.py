"""Issue 13, item 2: scripts/install.sh, staged with --root below a temp dir (it installs
the package from PyPI's dependencies into a real venv there). What it lays out, that the
daemon it installed runs a job from the installed CLI, that a second run keeps the admin's
config, and that --uninstall keeps the data unless --purge."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from noduslocal import testing

REPO = Path(__file__).resolve().parents[2]
PREFIX = "/opt/nl-test"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.getuid() != 0, reason="the shared install is root's"),
]


def install(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["bash", str(REPO / "scripts/install.sh"), "--root", str(root),
                             "--prefix", PREFIX, *args], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("stage")
    install(root)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_it_lays_out_everything(staged: Path) -> None:
    venv = staged / PREFIX.lstrip("/")
    assert (venv / "bin/noduslocald").is_file() and (venv / "bin/noduslocal").is_file()
    service = (staged / "etc/systemd/system/noduslocal.service").read_text()
    assert f"ExecStart={PREFIX}/bin/noduslocald --config /etc/noduslocal/config.toml" in service
    assert (staged / "etc/systemd/system/noduslocal.socket").read_text() == \
        (REPO / "systemd/noduslocal.socket").read_text().replace("/opt/noduslocal/", f"{PREFIX}/")
    groups = {line.split(":")[0] for line in (staged / "etc/group").read_text().splitlines()}
    assert {"noduslocal", "noduslocal-admin"} <= groups
    default = (REPO / "noduslocal/default_config.toml").read_text()
    assert (staged / "etc/noduslocal/config.toml").read_text() == default
    assert (staged / "etc/sysusers.d/noduslocal.conf").is_file()
    assert oct((staged / "var/lib/noduslocal").stat().st_mode & 0o777) == oct(0o711)
    assert os.readlink(staged / "usr/local/bin/noduslocal") == f"{PREFIX}/bin/noduslocal"
    assert (venv / "share/doc/architecture.md").is_file()


def test_the_installed_units_verify(staged: Path, tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.fail("systemd-analyze is needed (Debian: systemd)")
    units = []
    for name in ("noduslocal.service", "noduslocal.socket"):
        text = (staged / "etc/systemd/system" / name).read_text()
        units.append(tmp_path / name)
        units[-1].write_text(text.replace(PREFIX, str(staged / PREFIX.lstrip("/"))))
    result = subprocess.run([tool, "verify", "--man=no", *map(str, units)],
                            capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_the_installed_daemon_runs_a_job(staged: Path, lab_groups: None) -> None:
    """Everything the package needs at run time is in it (a regular install, not the
    checkout): the daemon starts, builds its host shim, and runs a job from the CLI."""
    venv = staged / PREFIX.lstrip("/")
    d = testing.Daemon(cpus=1, memory="1GiB")
    argv = [str(venv / "bin/noduslocald"), "--config", str(staged / "etc/noduslocal/config.toml"),
            "--socket", str(d.socket), "--data-dir", str(d.data_dir)]
    env = {**os.environ, "NODUSLOCAL_SOCKET": str(d.socket)}
    with open(d.log_path, "wb") as log:
        d.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        testing.wait_until(lambda: d.socket.exists() or d.proc.poll() is not None,  # type: ignore[union-attr]
                           "the socket")
        cli = str(venv / "bin/noduslocal")
        ran = subprocess.run([cli, "job", "run", "--", "echo", "installed"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert (ran.returncode, ran.stdout) == (0, "installed\n"), ran.stderr + d.log()
        doctor = subprocess.run([cli, "doctor"], env=env, capture_output=True, text=True,
                                timeout=60)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "config.toml: in force" in doctor.stdout
    finally:
        d.close()


def test_a_second_run_keeps_the_config_and_uninstall_keeps_the_data(staged: Path) -> None:
    config = staged / "etc/noduslocal/config.toml"
    config.write_text(config.read_text() + "user_max_jobs = 4\n")
    again = install(staged)
    assert "kept your config" in again.stdout
    assert config.read_text().endswith("user_max_jobs = 4\n")
    (staged / "var/lib/noduslocal/noduslocal.db").write_text("a job's history")
    install(staged, "--uninstall")
    assert not (staged / PREFIX.lstrip("/")).exists()
    assert not (staged / "etc/systemd/system/noduslocal.service").exists()
    assert not (staged / "usr/local/bin/noduslocal").is_symlink()
    assert config.exists() and (staged / "var/lib/noduslocal/noduslocal.db").exists()
    install(staged, "--uninstall", "--purge")
    assert not config.exists() and not (staged / "var/lib/noduslocal").exists()
    assert "noduslocal" not in (staged / "etc/group").read_text()


def test_bad_options_are_refused() -> None:
    result = subprocess.run(["bash", str(REPO / "scripts/install.sh"), "--purge"],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr.strip()) == (
        2, "install.sh: --purge goes with --uninstall")
