"""Whether new work may be made now: the data dir's disk above its reserve, and its owner
under their disk quota. A retried create that was made already (its idempotency key is
known) is let through, to be answered with what it made."""

from __future__ import annotations

from noduslocal.daemon.disk.usage import DiskUsage
from noduslocal.daemon.disk.watch import DiskWatch
from noduslocal.daemon.store import Store
from noduslocal.domain import errors


class Room:
    def __init__(self, disk: DiskWatch, usage: DiskUsage, store: Store) -> None:
        self.disk = disk
        self.usage = usage
        self.store = store

    def require(self, what: str, uid: int, user: str) -> None:
        """Refuse new work (`what`: "new jobs") of `user`."""
        self.disk.require_room(what)
        self.usage.require_under_quota(uid, user, what)

    async def require_unless_made(self, what: str, uid: int, user: str, table: str,
                                  idempotency_key: str | None) -> None:
        """As require, except for a retry of a create whose key made a row of `table`
        ("jobs" or "sweeps")."""
        try:
            self.require(what, uid, user)
        except errors.ResourceExhausted:
            if idempotency_key is None or not await self.store.fetchall(
                    f"SELECT 1 FROM {table} WHERE owner_uid = ? AND idempotency_key = ?",
                    (uid, idempotency_key)):
                raise
