"""Collecting a job's declared outputs from its workspace after an attempt: a file is
copied as it is, a directory as a tar, into a blob store named by sha256, within a size cap,
and sparse (a hole stays a hole). Paths are walked from the workspace's descriptor without
following any link, as workspace.py does.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

from noduslocal.daemon.files.blobs import BlobStore, HashingWriter, OverLimit
from noduslocal.daemon.files.workspace import DIR_FLAGS, open_parent
from noduslocal.domain import errors
from noduslocal.domain.job_paths import components
from noduslocal.domain.jobs import Collected

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class OutputLimits:
    per_output: int  # bytes
    per_job: int  # bytes of all of one attempt's outputs

    def for_next(self, used: int, room: int) -> tuple[int, str]:
        """The limit of the next output when the others took `used` and the disk has `room`
        above its reserve, and the limit's name."""
        left = self.per_job - used
        limits = [(self.per_output, f"max_output_size ({self.per_output} bytes)"),
                  (left, f"max_job_outputs ({self.per_job} bytes, {used} of them taken by "
                         "the job's other outputs)"),
                  (room, f"the room on the daemon's disk above its reserve ({room} bytes, "
                         "disk_reserve)")]
        return min(limits, key=lambda limit: limit[0])


def copy_sparse(fd: int, writer: HashingWriter, size: int) -> None:
    """The first `size` bytes of the file at `fd`, reading only its data, not its holes."""
    pos = 0
    while pos < size:
        try:
            data_at = min(os.lseek(fd, pos, os.SEEK_DATA), size)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # no SEEK_DATA here: read it all
                data_at = pos
                hole_at = size
            else:  # only a hole from here to the end
                data_at = hole_at = size
        else:
            hole_at = min(os.lseek(fd, data_at, os.SEEK_HOLE), size)
        if data_at > pos:
            writer.zeros(data_at - pos)
        os.lseek(fd, data_at, os.SEEK_SET)
        left = hole_at - data_at
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:  # shrank under us: what is there is what we keep
                return
            writer.write(chunk)
            left -= len(chunk)
        pos = hole_at


def collect(blobs: BlobStore, workspace: Path, name: str, rel: str, owner_uid: int,
            limit: int | None = None, cap: str = "") -> Collected | None:
    """Copy one output into the store; None when the job did not leave it there (or
    left a link, a device or a file another user owns, which are never read). One of
    more than `limit` bytes is left out, saying so with `cap` (what the limit is)."""
    parts = components(rel)
    try:
        parent = open_parent(workspace, parts)
    except errors.NotFound:
        return None
    try:
        try:
            info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if stat.S_ISREG(info.st_mode):
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=parent)
            kind = "file"
        elif stat.S_ISDIR(info.st_mode):
            fd = os.open(parts[-1], DIR_FLAGS, dir_fd=parent)
            kind = "dir"
        else:
            return None
    finally:
        os.close(parent)
    out, tmp = blobs.new()
    writer = HashingWriter(out, limit)
    kept = False
    try:
        if kind == "file":
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or not _owned(opened, owner_uid):
                return None
            if limit is not None and opened.st_size > limit:
                return Collected(name, rel, kind, opened.st_size, "",
                                 f"{opened.st_size} bytes, over {cap}")
            copy_sparse(fd, writer, opened.st_size)
        else:
            try:
                with tarfile.open(fileobj=writer, mode="w|",
                                  format=tarfile.PAX_FORMAT) as tar:
                    _add_tree(tar, fd, owner_uid)
            except OverLimit as over:
                return Collected(name, rel, kind, over.args[0], "",
                                 f"more than {limit} bytes as a tar, over {cap}")
        size, digest = blobs.keep(tmp, writer)
        kept = True
        mode = stat.S_IMODE(opened.st_mode) & 0o777 if kind == "file" else None
        return Collected(name, rel, kind, size, digest, mode=mode)
    finally:
        os.close(fd)
        if not kept:
            os.close(out)
            tmp.unlink(missing_ok=True)


def _owned(info: os.stat_result, owner_uid: int) -> bool:
    return owner_uid == 0 or info.st_uid == owner_uid


MAX_DEPTH = 256  # directory levels in a directory output; deeper ones are left out


def _add_tree(tar: tarfile.TarFile, top_fd: int, owner_uid: int) -> None:
    """Everything under the directory open at top_fd, walked without recursion (a job may
    leave a tree deeper than Python's stack) and without following links."""
    stack: list[tuple[int, str, int]] = [(os.dup(top_fd), "", 0)]
    try:
        while stack:
            dir_fd, prefix, depth = stack.pop()
            try:
                for name in sorted(os.listdir(dir_fd)):
                    _add_entry(tar, dir_fd, name, f"{prefix}{name}", owner_uid, depth, stack)
            finally:
                os.close(dir_fd)
    finally:
        for dir_fd, _, _ in stack:
            os.close(dir_fd)


def _add_entry(tar: tarfile.TarFile, dir_fd: int, name: str, arcname: str, owner_uid: int,
               depth: int, stack: list[tuple[int, str, int]]) -> None:
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    entry = tarfile.TarInfo(arcname)
    entry.mode, entry.mtime = stat.S_IMODE(info.st_mode), int(info.st_mtime)
    if stat.S_ISDIR(info.st_mode):
        if depth >= MAX_DEPTH:
            return
        entry.type = tarfile.DIRTYPE
        tar.addfile(entry)
        stack.append((os.open(name, DIR_FLAGS, dir_fd=dir_fd), f"{arcname}/", depth + 1))
    elif stat.S_ISLNK(info.st_mode):
        entry.type, entry.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dir_fd)
        tar.addfile(entry)  # kept as a link; what it points at is never read
    elif stat.S_ISREG(info.st_mode):
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        with os.fdopen(fd, "rb") as file:
            opened = os.fstat(file.fileno())  # what was opened, not what was looked at
            if stat.S_ISREG(opened.st_mode) and _owned(opened, owner_uid):
                entry.size = opened.st_size
                tar.addfile(entry, file)
