"""Store operations on what is not a job: users' secrets, named volumes, uploaded sources,
GPU drains. Each runs in the writer's transaction, as the job operations do.
"""

from __future__ import annotations

import sqlite3

from noduslocal.daemon.store.rows import TERMINAL_SQL
from noduslocal.domain import errors
from noduslocal.domain.jobs import Event, Owner


def set_secret(conn: sqlite3.Connection, owner_uid: int, name: str, value: str,
               now: float) -> tuple[bool, list[Event]]:
    """Create or replace a secret; True when it is new."""
    cur = conn.execute(
        "UPDATE secrets SET value = ?, updated_at = ? WHERE owner_uid = ? AND name = ?",
        (value, now, owner_uid, name))
    if cur.rowcount:
        return False, []
    conn.execute("INSERT INTO secrets (owner_uid, name, value, created_at, updated_at) "
                 "VALUES (?,?,?,?,?)", (owner_uid, name, value, now, now))
    return True, []


def delete_secret(conn: sqlite3.Connection, owner_uid: int,
                  name: str) -> tuple[None, list[Event]]:
    cur = conn.execute("DELETE FROM secrets WHERE owner_uid = ? AND name = ?",
                       (owner_uid, name))
    if not cur.rowcount:
        raise errors.NotFound(f"you have no secret named {name!r}")
    return None, []


def create_volume(conn: sqlite3.Connection, name: str, owner: Owner,
                  now: float) -> tuple[None, list[Event]]:
    if conn.execute("SELECT 1 FROM volumes WHERE name = ?", (name,)).fetchone():
        raise errors.AlreadyExists(f"name: volume {name!r} already exists", field="name")
    conn.execute("INSERT INTO volumes (name, owner_uid, owner, created_at) VALUES (?,?,?,?)",
                 (name, owner.uid, owner.name, now))
    return None, []


def delete_volume(conn: sqlite3.Connection, name: str) -> tuple[None, list[Event]]:
    """Forget a volume no unfinished job uses (its directory goes after the commit)."""
    users = conn.execute(
        f"SELECT j.name FROM job_volumes v JOIN jobs j ON j.id = v.job_id "
        f"WHERE v.volume = ? AND j.phase NOT IN ({TERMINAL_SQL}) LIMIT 3", (name,)).fetchall()
    if users:
        raise errors.Conflict(f"volume {name!r} is used by unfinished jobs: "
                              f"{', '.join(u[0] for u in users)}")
    conn.execute("DELETE FROM job_volumes WHERE volume = ?", (name,))
    if not conn.execute("DELETE FROM volumes WHERE name = ?", (name,)).rowcount:
        raise errors.NotFound(f"there is no volume {name!r}")
    return None, []


def record_source(conn: sqlite3.Connection, sha256: str, owner_uid: int, size: int,
                  now: float) -> tuple[None, list[Event]]:
    """An upload; uploading it again keeps it from retention for keep_ended anew."""
    conn.execute("INSERT INTO sources (sha256, owner_uid, size, created_at) VALUES (?,?,?,?) "
                 "ON CONFLICT (sha256, owner_uid) DO UPDATE SET created_at = excluded.created_at",
                 (sha256, owner_uid, size, now))
    return None, []


def touch_source(conn: sqlite3.Connection, sha256: str, owner_uid: int,
                 now: float) -> tuple[int | None, list[Event]]:
    """A client found its source uploaded and will name it: kept for keep_ended from now
    (in the writer, so a retention pass sees it before or not at all). Its size, or None
    when it is not (any more) there."""
    cur = conn.execute("UPDATE sources SET created_at = ? WHERE sha256 = ? AND owner_uid = ? "
                       "RETURNING size", (now, sha256, owner_uid))
    rows = cur.fetchall()
    return (rows[0][0] if rows else None), []


def set_drain(conn: sqlite3.Connection, uuid: str, drained: bool, by: str,
              now: float) -> tuple[None, list[Event]]:
    if drained:
        conn.execute("INSERT OR REPLACE INTO gpu_drains (uuid, by_user, at) VALUES (?,?,?)",
                     (uuid, by, now))
    else:
        conn.execute("DELETE FROM gpu_drains WHERE uuid = ?", (uuid,))
    return None, []


def set_user_hold(conn: sqlite3.Connection, uid: int, held: bool, by: str, now: float,
                  reason: str | None) -> tuple[None, list[Event]]:
    if held:
        conn.execute("INSERT OR REPLACE INTO user_holds (uid, by_user, at, reason) "
                     "VALUES (?,?,?,?)", (uid, by, now, reason))
    else:
        conn.execute("DELETE FROM user_holds WHERE uid = ?", (uid,))
    return None, []


def set_priority(conn: sqlite3.Connection, job_id: int,
                 priority: int) -> tuple[None, list[Event]]:
    conn.execute("UPDATE jobs SET spec = json_set(spec, '$.priority', ?) WHERE id = ?",
                 (priority, job_id))
    return None, []
