"""Opening a file in a directory the job's owner can write (a cluster attempt's records and
logs, written there by the shim as the owner): never through a link, never a FIFO or a
device, so the daemon neither reads what the owner may not nor blocks on a pipe.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotPlain(OSError):
    """The name is a link, a FIFO, a device or a directory, not a regular file."""


def open_plain(path: Path | str, owner: int | None = None) -> BinaryIO:
    """The regular file at `path`, opened for reading (FileNotFoundError when absent);
    with `owner`, only when that uid owns it."""
    fd, _ = _open_plain(path, owner)
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_plain(path: Path | str, limit: int, owner: int | None = None) -> bytes:
    """At most `limit` bytes of the regular file at `path` (see open_plain), read with no
    file object and up to the size it had when opened (no read to find the end): every
    task's end reads its exit record this way. O_NONBLOCK, kept, means nothing to a
    regular file's reads."""
    fd, size = _open_plain(path, owner)
    try:
        want, data = min(limit, size), b""
        while len(data) < want and (chunk := os.read(fd, want - len(data))):
            data += chunk
        return data
    finally:
        os.close(fd)


def _open_plain(path: Path | str, owner: int | None) -> tuple[int, int]:
    """The file's descriptor and its size, checked as open_plain says."""
    try:
        fd = os.open(path, FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symbolic link
            raise NotPlain(exc.errno, f"{path} is a link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotPlain(f"{path} is not a regular file")
        if owner is not None and info.st_uid != owner:
            raise NotPlain(f"{path} is not owned by uid {owner}")
        return fd, info.st_size
    except BaseException:
        os.close(fd)
        raise
