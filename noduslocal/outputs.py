"""Collecting a job's declared outputs from its workspace after an attempt: a file is
copied as it is, a directory as a tar, into a blob store named by sha256, within a size cap,
and sparse (a hole stays a hole). Paths are walked from the workspace's descriptor without
following any link, as workspace.py does.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import io
import os
import stat
import tarfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noduslocal import errors
from noduslocal.workspace import DIR_FLAGS, components, open_parent

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_ZEROS = bytes(1 << 20)


@dataclass(frozen=True)
class Collected:
    name: str
    path: str
    kind: str  # "file" or "dir" (a tar)
    size: int
    sha256: str
    skipped: str | None = None  # why it was left out of the store
    index: int = -1  # an indexed job's index that left it; -1 for an ordinary job


class OverLimit(Exception):
    pass


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


class HashingWriter(io.RawIOBase):
    """A file that hashes what is written to it (the blob is hashed once, as it is made),
    refuses to grow past `limit`, and leaves zeros as holes: a sparse output or a tar of
    one costs the disk what the job's copy did, not its apparent size."""

    def __init__(self, fd: int, limit: int | None = None) -> None:
        self.fd = fd
        self.digest = hashlib.sha256()
        self.size = 0
        self.limit = limit
        self._hole_at_end = False

    def writable(self) -> bool:
        return True

    def _grow(self, n: int) -> None:
        if self.limit is not None and self.size + n > self.limit:
            raise OverLimit(self.size + n)
        self.size += n

    def write(self, data: bytes) -> int:  # type: ignore[override]
        n = len(data)
        if n >= 4096 and data.count(0) == n:
            self.zeros(n)
            return n
        self._grow(n)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        self.digest.update(data)
        self._hole_at_end = False
        return n

    def zeros(self, n: int) -> None:
        """`n` zero bytes: hashed, skipped over in the file."""
        self._grow(n)
        os.lseek(self.fd, n, os.SEEK_CUR)
        self._hole_at_end = n > 0 or self._hole_at_end
        while n:
            step = min(n, len(_ZEROS))
            self.digest.update(memoryview(_ZEROS)[:step])
            n -= step

    def finish(self) -> None:
        if self._hole_at_end:  # a seek past the end makes no file size by itself
            os.ftruncate(self.fd, self.size)


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


class BlobStore:
    """Blobs by sha256. A blob just kept is pinned until its keeper has recorded it in the
    database (release()), and a retention pass deletes no blob released after it began to
    read the rows (it may not have seen that record): keep() and discard() take one lock
    around the file's name."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._pins: Counter[str] = Counter()
        self._released: dict[str, float] = {}  # digest -> monotonic time of its release

    def path(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256

    def new(self) -> tuple[int, Path]:
        """A temporary file in the store: write it through a HashingWriter, then keep()."""
        tmp = self.root / "tmp"
        tmp.mkdir(parents=True, mode=0o700, exist_ok=True)
        path = tmp / f"{os.getpid()}-{os.urandom(8).hex()}"
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), path

    def keep(self, tmp: Path, writer: HashingWriter) -> tuple[int, str]:
        """Sync the temporary file and move it to its name; (size, sha256)."""
        writer.finish()
        os.fsync(writer.fd)
        digest = writer.digest.hexdigest()
        final = self.path(digest)
        final.parent.mkdir(mode=0o700, exist_ok=True)
        with self._lock:
            os.replace(tmp, final)  # same content, same name: a second copy just replaces it
            self._pins[digest] += 1
        os.close(writer.fd)
        return writer.size, digest

    def release(self, digests: Iterable[str]) -> None:
        """The kept blobs `digests` are recorded (or given up): retention may judge them."""
        now = time.monotonic()
        with self._lock:
            for digest in digests:
                if digest:
                    self._released[digest] = now
                if digest and self._pins[digest] > 0:
                    self._pins[digest] -= 1
                    if not self._pins[digest]:
                        del self._pins[digest]

    async def recorded(self, write: asyncio.Future[Any], digests: Iterable[str]) -> Any:
        """Await `write` (the commit that records the kept blobs `digests`) and release them
        once it is done: a waiter cancelled meanwhile (a shutdown) does not cancel the
        commit, which still lands, so the blobs stay pinned until it has."""
        kept = [d for d in digests if d]
        write.add_done_callback(lambda _: self.release(kept))
        return await asyncio.shield(write)

    def stored(self) -> list[tuple[str, int, float]]:
        """Every blob on disk: (sha256, bytes it takes, mtime)."""
        found = []
        for shelf in _entries(self.root):
            if len(shelf.name) != 2 or not shelf.is_dir(follow_symlinks=False):
                continue
            for entry in _entries(Path(shelf.path)):
                with contextlib.suppress(FileNotFoundError):
                    info = entry.stat(follow_symlinks=False)
                    found.append((entry.name, info.st_blocks * 512, info.st_mtime))
        return found

    def discard(self, digests: Iterable[str], read_since: float,
                older_than: float) -> tuple[int, int]:
        """Delete the blobs `digests` that nobody has pinned nor released since the pass
        began to read the rows (`read_since`, monotonic) and whose file is older than
        `older_than` (epoch seconds); (how many, bytes freed)."""
        count = freed = 0
        for digest in digests:
            path = self.path(digest)
            with self._lock:
                if self._pins[digest] > 0 or self._released.get(digest, -1.0) >= read_since:
                    continue
                try:
                    info = path.stat(follow_symlinks=False)
                    if info.st_mtime >= older_than:
                        continue
                    path.unlink()
                except FileNotFoundError:
                    continue
            count, freed = count + 1, freed + info.st_blocks * 512
        with self._lock:  # passes run one at a time: the next one reads after this one
            self._released = {d: at for d, at in self._released.items() if at >= read_since}
        self._clear_tmp(older_than)
        return count, freed

    def _clear_tmp(self, older_than: float) -> None:
        """Temporary files a daemon before this one left (this one's are in use)."""
        mine = f"{os.getpid()}-"
        for entry in _entries(self.root / "tmp"):
            if entry.name.startswith(mine):
                continue
            with contextlib.suppress(FileNotFoundError):
                if entry.stat(follow_symlinks=False).st_mtime < older_than:
                    os.unlink(entry.path)

    def collect(self, workspace: Path, name: str, rel: str, owner_uid: int,
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
        out, tmp = self.new()
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
            size, digest = self.keep(tmp, writer)
            kept = True
            return Collected(name, rel, kind, size, digest)
        finally:
            os.close(fd)
            if not kept:
                os.close(out)
                tmp.unlink(missing_ok=True)


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except FileNotFoundError:
        return []


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
