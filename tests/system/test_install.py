"""Issue 13, item 2: scripts/install.sh, staged with --root below a temp dir (it installs
the package from PyPI's dependencies into a real venv there). What it lays out, that the
daemon it installed runs a job from the installed CLI, that a second run keeps the admin's
config, and that --uninstall keeps the data unless --purge."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from noduslocal import testing

REPO = Path(__file__).resolve().parents[2]
PREFIX = "/opt/nl-test"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.beside,  # a staged install of its own, its own users and daemon
    pytest.mark.skipif(os.getuid() != 0, reason="the shared install is root's"),
]


def install(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["bash", str(REPO / "scripts/install.sh"), "--root", str(root),
                             "--prefix", PREFIX, *args], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def staged() -> Iterator[Path]:
    # Where every user may look, as /opt is: the installed CLI and wheels are run by them.
    root = Path(tempfile.mkdtemp(prefix="nl-stage-", dir="/tmp"))
    os.chmod(root, 0o755)
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
        # Every check holds but dockerd's, which the container tests running beside this
        # module (scripts/test.sh's other process) restart now and then.
        failed = [line for line in doctor.stdout.splitlines()
                  if line.startswith("FAIL") and not line.startswith("FAIL dockerd")]
        assert failed == [] and doctor.stderr == "", doctor.stdout + doctor.stderr
        assert "config.toml: in force" in doctor.stdout
    finally:
        d.close()


def test_the_venv_is_built_on_an_interpreter_every_user_can_run(staged: Path) -> None:
    """Root's own python3 (pyenv's, in /root) is passed over for one that others can run;
    one given explicitly that they cannot run is refused, saying how to fix it."""
    venv = staged / PREFIX.lstrip("/")
    home = next(line.split("=", 1)[1].strip() for line in
                (venv / "pyvenv.cfg").read_text().splitlines() if line.startswith("home"))
    probe = subprocess.run(["runuser", "-u", "nobody", "--", f"{home}/python3", "-c", "1"],
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, (home, probe.stderr)
    private = Path(tempfile.mkdtemp(prefix="nl-private-", dir="/tmp"))  # mode 0700
    try:
        os.symlink(os.path.realpath(sys.executable), private / "python3")
        os.chmod(private, 0o700)
        refused = subprocess.run(
            ["bash", str(REPO / "scripts/install.sh"), "--root", str(private / "stage"),
             "--prefix", PREFIX], capture_output=True, text=True, timeout=600,
            env={**os.environ, "PYTHON": str(private / "python3")})
        private_real = os.path.realpath(sys.executable)
        if subprocess.run(["runuser", "-u", "nobody", "--", private_real, "-c", "1"],
                          capture_output=True).returncode == 0:
            pytest.skip(f"{private_real} is one every user can run here")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "other users cannot run" in refused.stderr
        assert "PYTHON=/usr/bin/python3" in refused.stderr
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_a_user_runs_the_installed_cli_and_installs_the_client_offline(staged: Path) -> None:
    """As a second user: the installed `noduslocal` works, and the client installs from the
    wheels install.sh left into the user's own venv with no index, and submits a job."""
    from tests.system.lab import open_box

    venv = staged / PREFIX.lstrip("/")
    wheels = venv / "wheels"
    assert any(wheels.glob("noduslocal-*.whl")), list(wheels.iterdir())
    with open_box(names=("nlinstalice", "nlinstbob"), keep_group=True) as box:
        user = box.alice
        listed = box.as_user(user.name, str(venv / "bin/noduslocal"), "job", "list")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        # doctor says the user's own python3 lacks the SDK, and how to install it.
        # As the user's own shell would run it: none of the lab's PYTHONPATH.
        argv = [a for a in box.argv_as(user.name, str(venv / "bin/noduslocal"), "doctor")
                if not a.startswith("PYTHONPATH=")]
        doctor = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
        line = next(x for x in doctor.stdout.splitlines() if "your python" in x)
        assert f"--find-links {PREFIX}/wheels noduslocal" in line.replace(str(staged), ""), line
        own = f"{user.home}/venv"
        made = box.as_user(user.name, "/usr/bin/python3", "-m", "venv", own, timeout=300)
        assert made.returncode == 0, made.stderr
        pip = box.as_user(user.name, f"{own}/bin/pip", "install", "-q", "--no-index",
                          "--find-links", str(wheels), "noduslocal", timeout=600)
        assert pip.returncode == 0, pip.stdout + pip.stderr
        script = ("import noduslocal as nodus; "
                  "job = nodus.Job.create(command=['echo', 'from my venv']); "
                  "print(job.wait().phase, *job.iter_logs())")
        # Not the lab's copy of the package: the one just installed (cwd is the lab's lib).
        ran = subprocess.run(box.argv_as(user.name, f"{own}/bin/python", "-I", "-c", script),
                             capture_output=True, text=True, timeout=120, cwd="/")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert ran.stdout.split() == ["Succeeded", "from", "my", "venv"], ran.stdout


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
