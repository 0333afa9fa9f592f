"""The blob store: files named by their sha256 (collected outputs, uploaded sources,
snapshots), written through a hashing writer that keeps holes as holes, pinned from the
moment a file has its name until its row is committed, and deleted by retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_ZEROS = bytes(1 << 20)


class OverLimit(Exception):
    pass


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


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except FileNotFoundError:
        return []
