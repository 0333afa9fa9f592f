"""The single writer: operations queue up while a commit is in flight and the next commit
takes all of them at once (group commit), so synchronous=FULL costs one fsync per batch,
not one per transition. A batch the disk has no room for is kept and tried again until it
commits: a job's end is never dropped because the disk filled. A commit needs room once the
WAL has used the space its last restart left (and a checkpoint, which may grow the database
file, cannot restart it); tries back off to FULL_RETRY_MAX, so the writer catches up within
seconds of the space returning.

A batch runs as one call on aiosqlite's worker thread: per-statement calls cost about
100 us each here (docs/benchmarks.md), more than the whole operation. A batch of quick
operations only (an attempt's start, Running and end: a few statements on rows by key) runs
its statements on the event loop and only its COMMIT, the fsync, on that thread: the
thread then holds the GIL for one call, not for each statement. The connection is used by
one side at a time: the loop waits for the COMMIT before it begins the next batch.

A quick batch whose every operation is `volatile` (it records processes of this machine,
which a power loss ends too) commits with synchronous=NORMAL, whole on the loop: no fsync,
so no trip to the thread (issue 25 part 5). A power loss may then lose the last such
commits, never a part of one: the WAL keeps a prefix of the history, so the next boot sees
the machine as it was a moment earlier (recovery puts back the starts it finds in the
attempts' directories, and judges an attempt whose end was lost as one the power loss
ended). They are on the disk within SYNC_WITHIN seconds: a checkpoint and an fdatasync of
the WAL on the thread, every CHECKPOINT_EVERY commits too. No commit on the loop syncs:
autocheckpoint is off for them, and the first write after a checkpoint, which may start
the WAL over and sync its header, commits on the thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiosqlite

from noduslocal.domain.jobs import Event

log = logging.getLogger(__name__)
FULL_RETRY_MAX = 5.0  # seconds between tries of a batch while the disk is full
LAZY_DELAY = 0.05  # seconds a lazy operation waits at most for another commit to ride with
QUICK_MAX = 64  # quick operations a batch may hold and still run on the loop
BUSY_WAIT_MS = 5000  # how long the thread waits for a write lock another connection holds
CHECKPOINT_EVERY = 64  # commits on the loop between two checkpoints on the thread
SYNC_WITHIN = 1.0  # seconds a commit on the loop waits at most to be on the disk
AUTOCHECKPOINT = 1000  # WAL pages: SQLite's default, for commits on the thread

# An operation: runs on the raw connection inside the open transaction and returns
# (result, events). It must not touch anything but the database.
Operation = Callable[[sqlite3.Connection], tuple[Any, list[Event]]]
OnCommit = Callable[[list[Event]], None]
# The bools: quick, volatile.
Queued = tuple[Operation, "asyncio.Future[Any]", bool, bool]


class Writer:
    def __init__(self, conn: aiosqlite.Connection, path: Path, on_commit: OnCommit,
                 batch_max: int) -> None:
        """`path`: the database's file (its WAL is synced beside it)."""
        self._conn = conn
        self._wal = f"{path}-wal"
        self._on_commit = on_commit
        self._batch_max = batch_max
        self._queue: list[Queued] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lazy: asyncio.TimerHandle | None = None
        self._closing = False
        self._volatile_mode = False  # the connection is set for volatile batches
        self._since_checkpoint = 0  # volatile commits since the last checkpoint
        self._unsynced = False  # volatile commits not known to be on the disk yet
        self._sync_due: asyncio.TimerHandle | None = None  # armed while _unsynced
        self._sync_now = False  # _make_durable() at the writer's next step
        self._fresh_wal = True  # the next write may start the WAL over (and sync it)
        self.stalled_since: float | None = None  # monotonic; while the disk is full

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="store-writer")

    def submit(self, op: Operation, lazy: bool = False, quick: bool = False,
               volatile: bool = False) -> asyncio.Future[Any]:
        """`lazy`: the operation waits (LAZY_DELAY at most) to join the commit of the next
        one that does not, in order with it, instead of costing a commit of its own.
        `quick`: a few statements on rows by key, which may run on the event loop.
        `volatile` (quick only): what it records ends with this machine (see module doc)."""
        if self._closing:
            raise RuntimeError("the store is closing")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((op, future, quick, quick and volatile))
        if not lazy:
            self._wake.set()
        elif self._lazy is None and not self._wake.is_set():
            self._lazy = loop.call_later(LAZY_DELAY, self._wake.set)
        return future

    def describe(self) -> str:
        """The writer's state in a line (the daemon's state dump)."""
        task = self._task
        return (f"writer: {len(self._queue)} queued, woken {self._wake.is_set()}, "
                f"task {'gone' if task is None or task.done() else 'running'}, "
                f"unsynced {self._unsynced}, stalled since {self.stalled_since}")

    def withdraw(self, future: asyncio.Future[Any]) -> bool:
        """Take the operation of FUTURE out of the queue, unanswered, if it is still there
        (no batch has taken it yet): its caller writes it with another operation instead
        and answers FUTURE when that one commits. False when it is too late."""
        for i, item in enumerate(self._queue):
            if item[1] is future:
                del self._queue[i]
                return True
        return False

    async def close(self) -> None:
        """Commit what is queued, then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._unsynced:  # a clean stop leaves every commit durable
            await self._make_durable()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            # One turn of the loop first: what is ready to run goes before the commit (an
            # armed attempt queued its start and lets its shim go meanwhile: runner.py),
            # and what it queues joins this batch.
            await asyncio.sleep(0)
            self._wake.clear()
            if self._lazy is not None:  # what it waited for goes now
                self._lazy.cancel()
                self._lazy = None
            delay = 0.1
            while self._queue:
                if self._sync_now:  # between batches too: a full disk may hold the queue
                    await self._make_durable()
                batch = self._queue[: self._batch_max]
                del self._queue[: self._batch_max]
                kept_out = await self._commit(batch)
                if not kept_out:
                    self._recovered()
                    delay = 0.1
                    continue
                self._queue[:0] = kept_out  # first again, in order, once there is room
                self._stalled()
                if self._closing and delay >= FULL_RETRY_MAX:
                    log.error("closing with %d operations the full disk kept out of the "
                              "database", len(self._queue))
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, FULL_RETRY_MAX)
            if self._sync_now:
                await self._make_durable()
            if self._closing:
                return

    def _stalled(self) -> None:
        if self.stalled_since is None:
            self.stalled_since = time.monotonic()
        log.warning("the database's disk is full: %d operations wait to be committed",
                    len(self._queue))

    def _recovered(self) -> None:
        if self.stalled_since is not None:
            log.info("the database commits again after %.0fs of a full disk",
                     time.monotonic() - self.stalled_since)
            self.stalled_since = None

    async def _commit(self, batch: list[Queued]) -> list[Queued]:
        """Commit the batch; what the disk had no room for comes back, unanswered."""
        ops = [item[0] for item in batch]
        try:
            outcomes = None
            if len(batch) <= QUICK_MAX and all(item[2] for item in batch):
                outcomes = await self._apply_here(ops, all(item[3] for item in batch))
            if outcomes is None:
                self._settings(volatile=False)
                self._fresh_wal = True  # its autocheckpoint may empty the WAL
                # aiosqlite's private call-on-thread: the one place we rely on it (see
                # module doc).
                outcomes = await self._conn._execute(_apply_waiting, self._conn._conn, ops)
        except Exception as exc:  # the connection itself failed: nobody's work is committed
            if disk_full(exc):
                return batch
            log.exception("commit failed")
            for item in batch:
                future = item[1]
                if not future.done():
                    future.set_exception(exc)
            return []
        events: list[Event] = []
        kept_out = []
        for item, (ok, value, evs) in zip(batch, outcomes, strict=True):
            future = item[1]
            if not ok and disk_full(value):
                kept_out.append(item)
                continue
            if ok:
                events.extend(evs)
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
        if events:
            self._on_commit(events)
        return kept_out

    async def _apply_here(self, ops: list[Operation], volatile: bool,
                          ) -> list[tuple[bool, Any, list[Event]]] | None:
        """The operations on the loop, their COMMIT on the thread (on the loop too when
        `volatile`); None (nothing written) when the batch must go to the thread whole as
        _apply() runs it: the write lock is taken (this connection does not wait for it:
        the loop must not block), an operation failed (each then runs alone there), or the
        COMMIT did."""
        conn = self._conn._conn
        self._settings(volatile)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return None
        try:
            results = []
            for op in ops:
                value, events = op(conn)
                results.append((True, value, events))
        except Exception:
            conn.execute("ROLLBACK")
            return None
        try:
            if volatile and not self._fresh_wal:
                conn.execute("COMMIT")
            else:
                await self._conn._execute(conn.execute, "COMMIT")
        except Exception:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return None
        if volatile:
            self._fresh_wal = False  # its frames went in: the WAL goes on from them
            self._unsynced = True
            self._since_checkpoint += 1
            if self._since_checkpoint >= CHECKPOINT_EVERY:
                self._sync_soon()
            elif self._sync_due is None and not self._sync_now:
                self._arm()
        return results

    def _arm(self) -> None:
        self._sync_due = asyncio.get_running_loop().call_later(SYNC_WITHIN, self._sync_soon)

    def _sync_soon(self) -> None:
        if self._sync_due is not None:
            self._sync_due.cancel()
            self._sync_due = None
        self._sync_now = True
        self._wake.set()

    def _settings(self, volatile: bool) -> None:
        """The connection as a batch needs it, changed only when the kind of batch does:
        with neither an fsync at COMMIT nor a checkpoint inside it for one on the loop."""
        if volatile == self._volatile_mode:
            return
        conn = self._conn._conn
        if volatile:
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        else:
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT}")
        self._volatile_mode = volatile

    async def _make_durable(self) -> None:
        """The volatile commits on the disk, and what they added to the WAL into the
        database, on the thread. A failed sync is tried again SYNC_WITHIN later."""
        self._sync_now = False
        self._since_checkpoint = 0
        try:
            await self._conn._execute(_checkpoint_and_sync, self._conn._conn, self._wal)
        except OSError as exc:  # the commits stand; they are not known durable yet
            log.warning("syncing the database's WAL failed: %s", exc)
            if not self._closing and self._sync_due is None:
                self._arm()
        else:
            self._unsynced = False
        # Whether the checkpoint copied the whole WAL or not, the next write may start it
        # over, which syncs its header: that write goes to the thread.
        self._fresh_wal = True


# What SQLite says when the disk has no room: SQLITE_FULL for the database and the WAL, and
# SQLITE_IOERR_SHMSIZE when the WAL's index (the -shm file, grown 32 KiB at a time) cannot
# grow. A connection that got either commits again once there is room.
NO_ROOM = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR_SHMSIZE})


def disk_full(exc: BaseException) -> bool:
    return (isinstance(exc, sqlite3.OperationalError)
            and getattr(exc, "sqlite_errorcode", None) in NO_ROOM)


def _checkpoint_and_sync(conn: sqlite3.Connection, wal: str) -> None:
    """PASSIVE: never waits for a reader; what it leaves goes next time."""
    try:
        # Its row read here: a cursor left unread would keep the statement open, and the
        # next COMMIT would fail ("SQL statements in progress").
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    except sqlite3.Error as exc:  # the WAL is synced all the same, below
        log.warning("checkpointing the database failed: %s", exc)
    # Synced whatever the checkpoint did: a reader's snapshot can keep it from copying
    # (and so from syncing) anything.
    fd = os.open(wal, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _apply_waiting(conn: sqlite3.Connection,
                   ops: list[Operation]) -> list[tuple[bool, Any, list[Event]]]:
    """_apply() on the thread, where waiting for a write lock held elsewhere is allowed
    (the connection's own timeout is 0: see Writer._apply_here)."""
    conn.execute(f"PRAGMA busy_timeout = {BUSY_WAIT_MS}")
    try:
        return _apply(conn, ops)
    finally:
        conn.execute("PRAGMA busy_timeout = 0")


def _apply(conn: sqlite3.Connection,
           ops: list[Operation]) -> list[tuple[bool, Any, list[Event]]]:
    """Run every operation in one transaction; if one raises, roll back and run each in a
    transaction of its own so only the faulty one fails."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        results = []
        for op in ops:
            value, events = op(conn)
            results.append((True, value, events))
        conn.execute("COMMIT")
        return results
    except Exception as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if len(ops) == 1 or disk_full(exc):  # no room: the whole batch waits as it is
            return [(False, exc, [])] * len(ops)
    return [_apply_one(conn, op) for op in ops]


def _apply_one(conn: sqlite3.Connection, op: Operation) -> tuple[bool, Any, list[Event]]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        value, events = op(conn)
        conn.execute("COMMIT")
        return True, value, events
    except Exception as exc:
        conn.execute("ROLLBACK")
        return False, exc, []
