"""A source packed by the client, without a daemon: what is left out (.git, what .gitignore
and .nodusignore say, as git reads them), what the upload says it sent, and the large-source
refusal. Sources through a real daemon are in tests/daemon/test_sources.py."""

from __future__ import annotations

import ast
import logging
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import noduslocal.sdk.source as source
from noduslocal.domain import errors
from noduslocal.sdk.source import Packed, pack


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    """ROOT with FILES (relative path -> content) written under it."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def members(packed: Packed) -> list[str]:
    """The file names in the tar (directories left out, so a test names only what matters)."""
    try:
        with tarfile.open(packed.path) as tar:
            return sorted(m.name for m in tar.getmembers() if not m.isdir())
    finally:
        packed.path.unlink()


def packed_names(root: Path) -> list[str]:
    return members(pack([root], contents_of_single_dir=True))


def test_large_sources_need_allow_large(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "LARGE_SOURCE", 10_000)
    (tmp_path / "big.bin").write_bytes(b"x" * 20_000)
    # The refusal names what is big and the ignore file that would leave it out.
    with pytest.raises(errors.InvalidArgument, match="allow_large_source=True") as refused:
        pack([tmp_path], contents_of_single_dir=True)
    assert "big.bin 19.5 KiB" in str(refused.value)
    assert f"{tmp_path.resolve()}/.nodusignore" in str(refused.value)
    packed = pack([tmp_path], contents_of_single_dir=True, allow_large=True)
    assert packed.size > 20_000
    packed.path.unlink()


def test_git_is_never_uploaded(tmp_path: Path) -> None:
    """.git as a directory (a checkout) or as a file (a worktree or a submodule), at any
    depth, with no ignore file saying so."""
    root = tree(tmp_path / "proj", {
        ".git/config": "[core]\n", ".git/objects/ab/cdef": b"\0" * 100,
        "train.py": "x", "vendor/lib/.git": "gitdir: ../../.git/modules/lib\n",
        "vendor/lib/lib.py": "y", "deep/a/b/.git/HEAD": "ref: refs/heads/main\n"})
    assert packed_names(root) == ["train.py", "vendor/lib/lib.py"]


def test_gitignore_applies_to_its_own_subtree_as_git_reads_it(tmp_path: Path) -> None:
    root = tree(tmp_path / "proj", {
        ".gitignore": "data/\n*.log\n!keep.log\n/build\n# a comment\n",
        "data/big.bin": "x", "sub/data/more.bin": "x",  # data/ matches at any depth
        "a.log": "x", "keep.log": "x",  # ! re-includes within the same file
        "build/out.o": "x", "sub/build/out.o": "x",  # /build is anchored at the root only
        "datafile": "x",  # data/ is a directory pattern: a file of that name stays
        "sub/.gitignore": "*.tmp\n!important.log\n/local.txt\n",
        "sub/x.tmp": "x", "x.tmp": "x",  # a nested file applies to its subtree only
        "sub/important.log": "x",  # the deeper file overrides the root's *.log
        "sub/local.txt": "x", "sub/deeper/local.txt": "x",  # anchored to sub/
    })
    assert packed_names(root) == [
        ".gitignore", "datafile", "keep.log", "sub/.gitignore", "sub/build/out.o",
        "sub/deeper/local.txt", "sub/important.log", "x.tmp"]


def test_nodusignore_beside_gitignore_has_the_last_word(tmp_path: Path) -> None:
    """Both are read in each directory; .nodusignore after .gitignore, so it can take back
    what git ignores (`!small.csv`) and leave out what git tracks (weights/)."""
    root = tree(tmp_path / "proj", {
        ".gitignore": "*.csv\n", ".nodusignore": "!small.csv\nweights/\n",
        "small.csv": "x", "big.csv": "x", "weights/w.bin": "x", "train.py": "x",
        "pkg/.nodusignore": "*.pyc\n", "pkg/m.py": "x", "pkg/m.pyc": "x", "m.pyc": "x",
        "pkg/big.csv": "x", "pkg/small.csv": "x"})
    assert packed_names(root) == [
        ".gitignore", ".nodusignore", "m.pyc", "pkg/.nodusignore", "pkg/m.py",
        "pkg/small.csv", "small.csv", "train.py"]


def test_a_file_under_an_ignored_directory_cannot_be_taken_back(tmp_path: Path) -> None:
    """As in git: once a directory is left out, nothing below it is looked at."""
    root = tree(tmp_path / "proj", {".gitignore": "out/\n!out/keep.txt\n",
                                    "out/keep.txt": "x", "out/other": "x", "a": "x"})
    assert packed_names(root) == [".gitignore", "a"]


def test_each_uploaded_directory_reads_its_own_ignore_files(tmp_path: Path) -> None:
    """`job run --upload pkg --upload notes.txt`: pkg's .gitignore applies inside pkg/,
    relative to it; a file named on its own is sent as it is."""
    pkg = tree(tmp_path / "pkg", {".gitignore": "/cache/\n", "cache/c": "x", "m.py": "x",
                                  "sub/cache/kept": "x"})
    notes = tmp_path / "notes.txt"
    notes.write_text("n")
    packed = pack([pkg, notes], contents_of_single_dir=False)
    assert packed.files == 4
    # Ranked one level into pkg/: pkg itself is not what one would leave out.
    assert [name for name, _ in packed.biggest] == [
        "pkg/.gitignore", "notes.txt", "pkg/m.py", "pkg/sub/"]  # ties by name
    assert packed.ignore_file == f"{pkg.resolve()}/.nodusignore"  # the one directory sent
    assert members(packed) == ["notes.txt", "pkg/.gitignore", "pkg/m.py", "pkg/sub/cache/kept"]


def test_an_ignored_directory_is_not_walked(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """One the packer could not read (a root-owned cache, a dead mount) does not fail the
    pack when it is ignored; one it needs still fails, naming it. Unreadable is simulated:
    the tests run as root, whom mode 000 does not stop."""
    root = tree(tmp_path / "proj", {".gitignore": "secret/\n", "secret/s": "x", "a": "x",
                                    "needed/n": "x"})
    real_scandir = os.scandir
    refused = {str(root / "secret"), str(root / "needed")}

    def scandir(path: str) -> Iterator[os.DirEntry[str]]:
        if os.fspath(path) in refused:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(errors.InvalidArgument, match=r"needed: Permission denied"):
        pack([root], contents_of_single_dir=True)
    refused.discard(str(root / "needed"))
    assert packed_names(root) == [".gitignore", "a", "needed/n"]


def test_the_count_and_the_biggest_entries(tmp_path: Path) -> None:
    root = tree(tmp_path / "proj", {
        "data/a.bin": b"x" * 5000, "data/sub/b.bin": b"x" * 4000, "model.pt": b"x" * 8000,
        "src/a.py": b"x" * 100, "src/b.py": b"x" * 100, "README.md": b"x" * 50,
        "setup.py": b"x" * 10, "tiny": b"", ".gitignore": "ignored.bin\n",
        "ignored.bin": b"x" * 100_000})
    packed = pack([root], contents_of_single_dir=True)
    packed.path.unlink()
    assert packed.files == 9  # directories are not counted, ignored files not sent
    assert packed.biggest[:5] == (("data/", 9000), ("model.pt", 8000), ("src/", 200),
                                  ("README.md", 50), (".gitignore", 12))
    assert packed.origin == str(root.resolve())


def test_what_the_upload_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              caplog: pytest.LogCaptureFixture) -> None:
    """One line; over the size (or file count) threshold, a warning that also names the
    biggest entries and the ignore file to write."""
    root = tree(tmp_path / "proj", {"data/a.bin": b"x" * 30_000, "train.py": b"x" * 1000})
    packed = pack([root], contents_of_single_dir=True)
    packed.path.unlink()
    level, text = source.report(packed)
    assert level == logging.INFO
    assert text == (f"code: {packed.size / 1024:.1f} KiB in 2 files from {root.resolve()} "
                    "(.git and ignored files left out)")
    monkeypatch.setattr(source, "WARN_SIZE", 20_000)
    level, text = source.report(packed)
    assert level == logging.WARNING
    first, *rest = text.splitlines()
    assert first.startswith("code: ") and first.endswith("(.git and ignored files left out)")
    assert "data/ 29.3 KiB" in rest[0] and "train.py 1000 B" in rest[0]
    assert rest[-1] == f"add them to {root.resolve()}/.nodusignore to leave them out"
    monkeypatch.setattr(source, "WARN_SIZE", 10**9)
    monkeypatch.setattr(source, "WARN_FILES", 1)
    assert source.report(packed)[0] == logging.WARNING
    # The SDK's default: the same text through the "noduslocal" logger.
    with caplog.at_level(logging.INFO, logger="noduslocal"):
        source.log(packed)
    assert [(r.name, r.levelno) for r in caplog.records] == [("noduslocal", logging.WARNING)]
    assert caplog.records[0].getMessage().startswith("code: ")


def test_the_daemon_imports_no_client_code() -> None:
    """The upload limit both sides use lives in the domain: no daemon module imports the
    SDK or the CLI (the daemon would then depend on what it serves)."""
    daemon = Path(source.__file__).parents[1] / "daemon"
    offenders = []
    for path in daemon.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path}: {n}" for n in names
                          if n.startswith(("noduslocal.sdk", "noduslocal.cli"))]
    assert offenders == []
