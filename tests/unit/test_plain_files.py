"""Reading a file in a directory the job's owner can write (daemon/files/plain.py): a
regular file only, never through a link, never blocking on a FIFO, only the owner's when
asked; and `limit` honoured."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from noduslocal.daemon.files.plain import NotPlain, open_plain, read_plain


def test_a_regular_file_is_read_up_to_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "exit.json"
    path.write_bytes(b"x" * 70_000)
    assert read_plain(path, 100) == b"x" * 100
    assert read_plain(path, 1 << 20) == b"x" * 70_000
    with open_plain(path) as file:
        assert os.get_blocking(file.fileno()) and file.read(5) == b"xxxxx"
    assert read_plain(path, 10, owner=os.getuid()) == b"x" * 10


def test_what_is_not_a_plain_file_of_its_owner_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_text("root's")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")  # a read would block: refused before any read
    (tmp_path / "dir").mkdir()
    for name in ("link", "fifo", "dir"):
        with pytest.raises(NotPlain):
            read_plain(tmp_path / name, 10)
    with pytest.raises(NotPlain, match="not owned by uid"):
        read_plain(target, 10, owner=os.getuid() + 1)
    with pytest.raises(FileNotFoundError):
        read_plain(tmp_path / "absent", 10)
