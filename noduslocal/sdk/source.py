"""Packing a job's source on the client: files and directories into one tar, honouring a
`.nodusignore` (gitignore syntax) at the top of each directory, and hashed, so the daemon
stores it once by sha256."""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pathspec

from noduslocal.domain import errors
from noduslocal.domain.jobs import LARGE_SOURCE

IGNORE_FILE = ".nodusignore"


@dataclass(frozen=True)
class Packed:
    path: Path  # a temporary tar; the caller removes it
    sha256: str
    size: int


def _ignore(root: Path) -> pathspec.GitIgnoreSpec | None:
    rules = root / IGNORE_FILE
    if not rules.is_file():
        return None
    return pathspec.GitIgnoreSpec.from_lines(rules.read_text().splitlines())


def _unreadable(exc: OSError) -> None:
    raise exc  # a directory left out of the walk would be a job missing files, unsaid


def _add_dir(tar: tarfile.TarFile, root: Path, prefix: str) -> None:
    spec = _ignore(root)
    for current, dirs, files in os.walk(root, onerror=_unreadable):
        rel_dir = os.path.relpath(current, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirs.sort()
        for name in list(dirs):
            if spec is not None and spec.match_file(f"{rel_dir}{name}/"):
                dirs.remove(name)  # an ignored directory is not walked at all
                continue
            tar.add(os.path.join(current, name), f"{prefix}{rel_dir}{name}", recursive=False)
        for name in sorted(files):
            if spec is not None and spec.match_file(f"{rel_dir}{name}"):
                continue
            tar.add(os.path.join(current, name), f"{prefix}{rel_dir}{name}", recursive=False)


def pack(paths: list[Path], *, contents_of_single_dir: bool,
         allow_large: bool = False) -> Packed:
    """One tar of PATHS: each at its own name, or (`contents_of_single_dir`, the SDK's
    `source="dir"`) the contents of a single directory at the top. A path that cannot be
    read is InvalidArgument naming it, as one that does not exist."""
    try:
        return _pack(paths, contents_of_single_dir, allow_large)
    except OSError as exc:
        where = exc.filename or (paths[0] if len(paths) == 1 else "a source path")
        raise errors.InvalidArgument(
            f"source: {where}: {exc.strerror or exc} (leave what you cannot read out with a "
            f"{IGNORE_FILE})", field="source") from None


def _pack(paths: list[Path], contents_of_single_dir: bool, allow_large: bool) -> Packed:
    for path in paths:
        if not path.exists():
            raise errors.InvalidArgument(f"source: {path} does not exist", field="source")
    fd, name = tempfile.mkstemp(prefix="noduslocal-source-", suffix=".tar")
    os.close(fd)
    tmp = Path(name)
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            for path in paths:
                if path.is_dir():
                    single = contents_of_single_dir and len(paths) == 1
                    prefix = "" if single else f"{path.resolve().name}/"
                    if prefix:
                        tar.add(path, prefix.rstrip("/"), recursive=False)
                    _add_dir(tar, path, prefix)
                else:
                    tar.add(path, path.name, recursive=False)
        size = tmp.stat().st_size
        if size > LARGE_SOURCE and not allow_large:
            raise errors.InvalidArgument(
                f"source: {size / 2**20:.0f} MiB packed; more than "
                f"{LARGE_SOURCE // 2**20} MiB needs allow_large_source=True "
                "(or a .nodusignore that leaves out data and checkpoints)", field="source")
        digest = hashlib.sha256()
        with tmp.open("rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
        return Packed(tmp, digest.hexdigest(), size)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
