"""Whether the database is sound: quick_check at every start (a damaged one is refused with
how to restore), and the full integrity_check that `noduslocal doctor` asks for.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["DatabaseDamaged", "check_intact", "integrity_problems"]


class DatabaseDamaged(RuntimeError):
    """The database failed its check: the daemon must not run on it."""


def check_intact(conn: sqlite3.Connection, path: Path) -> None:
    """PRAGMA quick_check, which reads every page: a damaged database is refused at start
    rather than failing creates later with "malformed"."""
    try:
        problems = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
    except sqlite3.DatabaseError as exc:
        problems = [str(exc)]
    if problems == ["ok"]:
        return
    raise DatabaseDamaged(
        f"{path} is damaged ({'; '.join(problems)}); noduslocald will not run on it. To "
        f"restore: stop the daemon, move {path} (and its -wal and -shm files) aside, copy "
        f"your latest `noduslocal admin backup` to {path}, start. Without a backup, "
        f"`sqlite3 OLD .recover | sqlite3 {path}` saves what can be read.")


def integrity_problems(path: Path, most: int = 20) -> list[str]:
    """PRAGMA integrity_check on a connection of its own (it reads every page and index, so
    it may take a while, and never holds up the daemon's reads); [] when intact."""
    conn = sqlite3.connect(path)
    try:
        problems = [row[0] for row in conn.execute(f"PRAGMA integrity_check({most:d})")]
    except sqlite3.DatabaseError as exc:
        problems = [str(exc)]
    finally:
        conn.close()
    return [] if problems == ["ok"] else problems
