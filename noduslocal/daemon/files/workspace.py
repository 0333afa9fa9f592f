"""Reading a job's kept workspace for its owner: paths are walked one component at a time
with O_NOFOLLOW from the workspace's own descriptor, so neither `..` nor a link the job
left there can lead the daemon (often root) outside it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from noduslocal.domain import errors
from noduslocal.domain.job_paths import components
from noduslocal.domain.timefmt import iso

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_parent(root: Path, parts: list[str]) -> int:
    """A descriptor of the directory that holds the last part (the root for no parts)."""
    try:
        fd = os.open(root, DIR_FLAGS)
    except FileNotFoundError:
        raise errors.NotFound(f"{root} does not exist") from None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except (FileNotFoundError, NotADirectoryError, OSError) as exc:
        os.close(fd)
        raise errors.NotFound(f"{'/'.join(parts)}: no such directory in the workspace "
                              f"({exc.strerror})") from None
    return fd


def _entry(name: str, path: str, info: os.stat_result, dir_fd: int) -> dict[str, Any]:
    mode = info.st_mode
    kind = ("dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode)
            else "link" if stat.S_ISLNK(mode) else "other")
    entry: dict[str, Any] = {"name": name, "path": path, "type": kind, "size": info.st_size,
                             "mode": f"{stat.S_IMODE(mode):04o}", "mtime": iso(info.st_mtime)}
    if kind == "link":
        with contextlib.suppress(OSError):
            entry["target"] = os.readlink(name, dir_fd=dir_fd)
    return entry


def list_path(root: Path, path: str) -> list[dict[str, Any]]:
    """The entries of a directory (sorted by name), or the one entry of a file or link."""
    parts = components(path)
    parent = open_parent(root, parts)
    try:
        if parts:
            try:
                info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                raise errors.NotFound(f"{path}: not in the workspace") from None
            if not stat.S_ISDIR(info.st_mode):
                return [_entry(parts[-1], "/".join(parts), info, parent)]
            fd = os.open(parts[-1], DIR_FLAGS, dir_fd=parent)
        else:
            fd = os.dup(parent)
        try:
            prefix = "/".join(parts)
            entries = []
            for name in sorted(os.listdir(fd)):
                with contextlib.suppress(FileNotFoundError):
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    entries.append(_entry(name, f"{prefix}/{name}" if prefix else name,
                                          info, fd))
            return entries
        finally:
            os.close(fd)
    finally:
        os.close(parent)


def open_file(root: Path, path: str, owner_uid: int) -> tuple[int, int, str]:
    """(descriptor, size, sha256) of a regular file in the workspace; the caller closes.
    A file not owned by the job's owner is refused: where hard links are not protected
    (fs.protected_hardlinks=0) a job could link in a file it may not read."""
    parts = components(path)
    if not parts:
        raise errors.InvalidArgument("path: name a file in the workspace", field="path")
    parent = open_parent(root, parts)
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=parent)
    except FileNotFoundError:
        raise errors.NotFound(f"{path}: not in the workspace") from None
    except OSError as exc:  # ELOOP: a link, which is never followed
        raise errors.InvalidArgument(f"{path}: not a regular file ({exc.strerror})",
                                     field="path") from None
    finally:
        os.close(parent)
    info = os.fstat(fd)
    if owner_uid != 0 and info.st_uid != owner_uid:
        os.close(fd)
        raise errors.PermissionDenied(f"{path}: owned by uid {info.st_uid}, not by the job's "
                                      "owner; not served")
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise errors.InvalidArgument(f"{path}: {kind}; download files one at a time",
                                     field="path")
    digest = hashlib.sha256()
    for chunk in iter_chunks(fd):
        digest.update(chunk)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd, info.st_size, digest.hexdigest()


def iter_chunks(fd: int, size: int = 1 << 20) -> Iterator[bytes]:
    while chunk := os.read(fd, size):
        yield chunk
