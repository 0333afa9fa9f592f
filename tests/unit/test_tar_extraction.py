"""A directory output's tar unpacked safely by this interpreter, with tarfile's filter and
with the SDK's own checks (what a Python without `filter` uses): nothing lands or points
outside the destination, no absolute path, no device or FIFO, no setuid bit, no owner from
the archive, and both ways take the same members. The same on Debian's python3 3.11.2 and a
download through a real daemon: tests/system/test_download_extract.py."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import warnings
from pathlib import Path
from typing import Any

import pytest

from noduslocal.sdk import extract


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
