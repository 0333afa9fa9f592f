"""Downloading a directory output unpacks its tar safely on every Python 3.11 patch release:
on Debian's /usr/bin/python3 (3.11.2, which scripts/install.sh uses and whose tarfile has no
`filter`) as on the newer interpreter of the tests. Nothing lands or points outside the
destination, no absolute path, no device or FIFO, no setuid bit, no owner from the archive.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pathspec
import pytest

from noduslocal import testing
from noduslocal.domain.sockets import SOCKET_ENV
from noduslocal.sdk import extract

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


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x", mode: int = 0o644,
            link: str = "", uid: int = 0) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.uid, info.uname = kind, mode, link, uid, "nobody"
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    return info, None


HOSTILE = [
    _member("ok.txt", mode=0o6777, uid=4242),
    _member("dir", tarfile.DIRTYPE, mode=0o777),
    _member("dir/inner.txt"),
    _member("/abs.txt"),
    _member("../escape.txt"),
    _member("dir/../../escape2.txt"),
    _member("abslink", tarfile.SYMTYPE, link="/etc/passwd"),
    _member("uplink", tarfile.SYMTYPE, link="../outside"),
    _member("goodlink", tarfile.SYMTYPE, link="dir/inner.txt"),
    _member("dirlink", tarfile.SYMTYPE, link="dir"),
    _member("dirlink/through.txt"),
    _member("esc", tarfile.SYMTYPE, link="dir/../.."),
    _member("esc/pwned.txt"),
    _member("hard", tarfile.LNKTYPE, link="../outside.txt"),
    _member("hardabs", tarfile.LNKTYPE, link="/etc/passwd"),
    _member("hardgood", tarfile.LNKTYPE, link="ok.txt", mode=0o6777),
    _member("dev", tarfile.CHRTYPE),
    _member("blk", tarfile.BLKTYPE),
    _member("fifo", tarfile.FIFOTYPE),
]
LEFT_OUT = {"/abs.txt", "../escape.txt", "dir/../../escape2.txt", "abslink", "uplink", "esc",
            "hard", "hardabs", "dev", "blk", "fifo"}


def hostile_tar(path: Path) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in HOSTILE:
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return path


def tree(top: Path) -> dict[str, Any]:
    """What is under TOP: each path with its type, mode and owner (links with target)."""
    found: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            entry: dict[str, Any] = {"mode": oct(stat.S_IMODE(info.st_mode)),
                                     "uid": info.st_uid}
            if stat.S_ISDIR(info.st_mode):  # the filter leaves a directory's to the umask
                entry = {"dir": True, "uid": info.st_uid}
            elif stat.S_ISLNK(info.st_mode):
                entry = {"link": os.readlink(path)}
            elif not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
                entry = {"special": stat.S_IFMT(info.st_mode)}
            found[str(path.relative_to(top))] = entry
    return found


def check_unpacked(box: Path, warned: list[str]) -> dict[str, Any]:
    got = tree(box)
    outside = {p for p in got if not p.startswith("dest/") and p != "dest"}
    assert outside == {"outside.txt"}, outside  # only what was there before
    inside = {p.removeprefix("dest/"): e for p, e in got.items() if p.startswith("dest/")}
    assert set(inside) == {"ok.txt", "dir", "dir/inner.txt", "dir/through.txt", "goodlink",
                           "dirlink", "esc", "esc/pwned.txt", "hardgood"}, inside
    assert inside["ok.txt"] == {"mode": "0o755", "uid": os.geteuid()}  # no setuid, no 4242
    assert inside["goodlink"] == {"link": "dir/inner.txt"}
    assert not any("special" in e for e in inside.values())
    assert (box / "outside.txt").read_text() == "keep"
    for name in LEFT_OUT:
        assert any(repr(name) in w or name in w for w in warned), (name, warned)
    return inside


def _unpack_here(archive: Path, dest: Path, checked_only: bool) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tarfile.open(archive) as tar:
            if checked_only:
                extract.extract_checked(tar, str(dest))
            else:
                extract.extract(tar, str(dest))
    return [str(w.message) for w in caught]


@pytest.fixture
def box(tmp_path: Path) -> Path:
    box = tmp_path / "box"
    (box / "dest").mkdir(parents=True)
    (box / "outside.txt").write_text("keep")
    return box


@pytest.mark.parametrize("checked_only", [False, True], ids=["with-filter", "own-checks"])
def test_a_hostile_archive_on_this_python(tmp_path: Path, box: Path,
                                          checked_only: bool) -> None:
    if not checked_only and not hasattr(tarfile, "data_filter"):
        pytest.skip("this interpreter has no tarfile filter")
    warned = _unpack_here(hostile_tar(tmp_path / "h.tar"), box / "dest", checked_only)
    check_unpacked(box, warned)


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
                                                box: Path) -> None:
    archive = hostile_tar(tmp_path / "h.tar")
    result = subprocess.run([str(system_venv), "-c", UNPACK, str(archive), str(box / "dest")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    check_unpacked(box, json.loads(result.stdout))


def test_the_same_members_come_through_either_way(tmp_path: Path) -> None:
    """The filter of newer interpreters and the checks made here agree member by member."""
    if not hasattr(tarfile, "data_filter"):
        pytest.skip("this interpreter has no tarfile filter")
    archive = hostile_tar(tmp_path / "h.tar")
    results = []
    for checked_only in (False, True):
        box = tmp_path / f"box-{checked_only}"
        (box / "dest").mkdir(parents=True)
        (box / "outside.txt").write_text("keep")
        _unpack_here(archive, box / "dest", checked_only)
        results.append(tree(box / "dest"))
    assert results[0] == results[1]

