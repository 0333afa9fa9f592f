"""Downloading a directory output unpacks its tar safely on every Python 3.11 patch release:
on Debian's /usr/bin/python3 (3.11.2, which scripts/install.sh uses and whose tarfile has no
`filter`) as on the newer interpreter of the tests. Nothing lands or points outside the
destination, no absolute path, no device or FIFO, no setuid bit, no owner from the archive.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click
import pathspec
import pytest

from noduslocal import testing
from noduslocal.domain.sockets import SOCKET_ENV
from tests.unit.test_tar_extraction import box, check_unpacked, hostile_tar  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def system_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv of Debian's python3 (`--system-site-packages`, as a user would make one),
    with this checkout and the CLI's two pure-Python dependencies on its path."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"{SYSTEM_PYTHON} is needed")
        pytest.skip(f"{SYSTEM_PYTHON} is missing")
    root = tmp_path_factory.mktemp("sysvenv")
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(root / "venv")], check=True, capture_output=True, timeout=120)
    lib = root / "lib"
    for package in (click, pathspec):
        source = Path(package.__file__).parent
        shutil.copytree(source, lib / source.name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    site = next((root / "venv" / "lib").glob("python3*/site-packages"))
    (site / "noduslocal-checkout.pth").write_text(f"{REPO}\n{lib}\n")
    python = root / "venv" / "bin" / "python"
    return python


def version(python: Path | str) -> tuple[int, ...]:
    out = subprocess.run([str(python), "-c", "import sys; print(list(sys.version_info[:3]))"],
                         capture_output=True, text=True, check=True).stdout
    return tuple(json.loads(out))


def test_the_system_python_is_one_without_tarfiles_filter(system_venv: Path) -> None:
    """What makes the rest of this module mean something: the interpreter under test is
    older than tarfile's extraction filters (3.11.4)."""
    assert version(system_venv)[:2] == (3, 11)
    probe = subprocess.run([str(system_venv), "-c",
                            "import tarfile; print(hasattr(tarfile, 'data_filter'))"],
                           capture_output=True, text=True, check=True)
    if probe.stdout.strip() != "False":
        pytest.skip(f"{SYSTEM_PYTHON} {version(system_venv)} has tarfile's filters")


# --- the download, from the CLI on Debian's python3, of a real daemon's output -------------

MAKE = ("mkdir -p out/sub && echo a > out/a.txt && echo b > out/sub/b.txt"
        " && chmod 4755 out/a.txt && ln -s /etc/shadow out/leak && ln -s ../../.. out/up"
        " && ln -s sub/b.txt out/rel")


@pytest.fixture(scope="module")
def made() -> Iterator[testing.Daemon]:
    with testing.daemon(cpus=2, memory="8GiB") as d:
        client = d.client()
        client.create_job({"name": "maker", "command": ["sh", "-c", MAKE],
                           "outputs": {"out": "out"}})
        assert client.wait_job("maker", timeout=60)["phase"] == "Succeeded"
        yield d


def test_download_output_of_a_directory_on_the_system_python(
        made: testing.Daemon, system_venv: Path, tmp_path: Path) -> None:
    dest = tmp_path / "box" / "got"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           SOCKET_ENV: str(made.socket)}
    result = subprocess.run([str(system_venv), "-m", "noduslocal.cli", "job",
                             "download-output", "maker", "out", str(dest)],
                            capture_output=True, text=True, env=env, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout.strip() == str(dest)
    assert (dest / "a.txt").read_text() == "a\n"
    assert (dest / "sub" / "b.txt").read_text() == "b\n"
    assert os.readlink(dest / "rel") == "sub/b.txt"
    assert not stat.S_IMODE((dest / "a.txt").stat().st_mode) & stat.S_ISUID
    for refused in ("leak", "up"):  # links out of it: left out, each said
        assert not os.path.lexists(dest / refused)
        assert f"'{refused}'" in result.stderr or f"{refused!r}" in result.stderr, \
            result.stderr
    assert sorted(p.name for p in (tmp_path / "box").iterdir()) == ["got"]


# --- hostile archives, member by member -----------------------------------------------------


UNPACK = """
import json, sys, tarfile, warnings
from noduslocal.sdk.extract import extract
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with tarfile.open(sys.argv[1]) as tar:
        extract(tar, sys.argv[2])
print(json.dumps([str(w.message) for w in caught]))
"""


def test_a_hostile_archive_on_the_system_python(system_venv: Path, tmp_path: Path,
                                                box: Path) -> None:  # noqa: F811
    archive = hostile_tar(tmp_path / "h.tar")
    result = subprocess.run([str(system_venv), "-c", UNPACK, str(archive), str(box / "dest")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    check_unpacked(box, json.loads(result.stdout))


