"""Numbered .sql migrations, each applied in its own transaction with its PRAGMA user_version.

Statements are run one by one (never executescript, which commits the open transaction), so
a migration that fails leaves the schema and the version exactly as they were.
"""

from __future__ import annotations

import re
import sqlite3
from importlib import resources

_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def available() -> list[tuple[int, str, str]]:
    """(version, file name, SQL text) for every shipped migration, in order."""
    found = []
    for entry in resources.files("noduslocal.daemon.store.migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text()))
    found.sort()
    for expected, (version, name, _) in enumerate(found, start=1):
        if version != expected:
            raise RuntimeError(f"migration {name} is out of sequence; expected {expected:04d}")
    return found


def split_statements(sql: str) -> list[str]:
    """One string per statement; a statement ends at a `;` that completes it (so a trigger
    body's inner `;` and one inside a string do not)."""
    statements, current = [], ""
    for line in sql.splitlines(keepends=True):
        if not current.strip() and line.lstrip().startswith("--"):
            continue
        start = 0
        for index, char in enumerate(line):
            if char == ";" and sqlite3.complete_statement(current + line[start:index + 1]):
                statements.append((current + line[start:index + 1]).strip())
                current, start = "", index + 1
        current += line[start:]
        if not current.strip():
            current = ""
    if current.strip():
        raise RuntimeError(f"incomplete SQL statement at the end of a migration: {current!r}")
    return statements


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the database to the newest schema; returns the version it ends at."""
    current = conn.execute("PRAGMA user_version").fetchone()[0]
    migrations = available()
    if current > len(migrations):
        raise RuntimeError(
            f"the database is at schema {current}, newer than this noduslocal knows "
            f"({len(migrations)}); run a newer noduslocald"
        )
    for version, _name, sql in migrations[current:]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in split_statements(sql):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version:d}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return len(migrations)
