"""Retention's parts without a daemon: the store's pass (reclaim_due) over many ended jobs in
small transactions and its dry run past one batch, on SQLite on disk with the real schema;
and the blob store's rule of when a blob may go (pinned, released late, or young, it stays).
Retention through a real daemon is in tests/daemon/test_retention.py."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from noduslocal.daemon.files.blobs import BlobStore, HashingWriter
from noduslocal.daemon.store import Store, reclaim, resources
from noduslocal.daemon.store.migrate import migrate

HOUR = 3600.0


def test_a_pass_goes_through_many_jobs_in_small_transactions(tmp_path: Path) -> None:
    """Past one batch: every due job collected once, each with its event; jobs of a user
    who keeps forever, and jobs not yet due, untouched (SQLite on disk, the real schema)."""
    conn = sqlite3.connect(tmp_path / "db", isolation_level=None)
    migrate(conn)
    now, day = time.time(), 86400.0
    for i in range(1, 2 * reclaim.BATCH + 51):
        owner = "keeper" if i % 5 == 0 else "user"
        ended = now - (day if i % 7 == 0 else 20 * day)
        conn.execute("INSERT INTO jobs (id, project, name, owner_uid, owner_gid, owner, phase, "
                     "spec, labels, created_at, ended_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                     (i, "p", f"j{i}", 1000, 1000, owner, "Succeeded",
                      json.dumps({"command": ["true"]}), "{}", ended - 1, ended))

    def keep(user: str) -> float | None:
        return None if user == "keeper" else 14 * day

    seen, after, batches = [], (-1.0, 0), 0
    while True:
        conn.execute("BEGIN IMMEDIATE")
        found, events = reclaim.reclaim_due(conn, now, keep, 14 * day, frozenset({3}), False,
                                          after)
        conn.execute("COMMIT")
        batches += 1
        seen += [job.id for job in found.jobs]
        assert len(events) == len(found.jobs)
        if found.after is None:
            break
        after = found.after
    expected = [i for i in range(1, 2 * reclaim.BATCH + 51)
                if i % 5 and i % 7 and i != 3]
    assert sorted(seen) == expected and len(set(seen)) == len(seen)
    assert batches >= 2
    collected = {i for (i,) in conn.execute(
        "SELECT id FROM jobs WHERE collected_at IS NOT NULL")}
    assert collected == set(expected)
    assert conn.execute("SELECT count(*) FROM events WHERE reason = 'Collected'").fetchone()[0] \
        == len(expected)


def test_a_blob_is_spared_while_pinned_released_late_or_young(tmp_path: Path) -> None:
    """BlobStore.discard, on real files: a pin, a release at or after the pass began
    reading, and a file younger than the grace each keep a blob; an old release does not."""
    blobs = BlobStore(tmp_path / "blobs")
    digests = []
    for content in (b"pinned", b"released late", b"young", b"old"):
        fd, tmp = blobs.new()
        writer = HashingWriter(fd)
        writer.write(content)
        digests.append(blobs.keep(tmp, writer)[1])
    pinned, late, young, old = digests
    blobs.release([late, young, old])  # `pinned` keeps its pin
    read_since = time.monotonic()
    blobs.release([late])  # a second keeper recorded it after the pass began reading
    then = time.time() - HOUR
    for digest in (pinned, late, old):
        os.utime(blobs.path(digest), (then, then))
    with blobs._lock:  # as if `old` and `young` were released before the pass began
        blobs._released[old] = blobs._released[young] = read_since - 1
    count, freed = blobs.discard(digests, read_since, time.time() - 600)
    assert count == 1 and freed > 0
    assert [blobs.path(d).exists() for d in digests] == [True, True, True, False]
    blobs.release([pinned])
    assert blobs.discard([pinned], time.monotonic(), time.time() - 600)[0] == 1


def test_a_cancelled_recorder_keeps_its_blob_pinned_until_the_commit(tmp_path: Path) -> None:
    """A shutdown cancels the handler that waits for its upload's row; the writer still
    commits it, so the pin holds until then (a real store on disk, its commit held back)."""
    store = Store(tmp_path / "db")
    blobs = BlobStore(tmp_path / "blobs")

    async def scenario() -> tuple[bool, bool]:
        await store.open(lambda events: None)
        try:
            fd, tmp = blobs.new()
            writer = HashingWriter(fd)
            writer.write(b"source")
            _, digest = blobs.keep(tmp, writer)

            go_on = threading.Event()

            def held_record(conn: sqlite3.Connection) -> tuple[None, list[Any]]:
                go_on.wait(30)  # the commit is held back until the waiter was cancelled
                return resources.record_source(conn, digest, 0, 6, time.time())

            write = store.write(held_record)
            waiter = asyncio.ensure_future(blobs.recorded(write, [digest]))
            await asyncio.sleep(0.05)
            waiter.cancel()
            await asyncio.sleep(0)
            pinned_while_committing = blobs._pins[digest] > 0
            go_on.set()
            await asyncio.wait_for(asyncio.shield(write), 30)
            await asyncio.sleep(0)  # the done callbacks
            return pinned_while_committing, blobs._pins[digest] == 0
        finally:
            await store.close()

    assert asyncio.run(scenario()) == (True, True)
    conn = sqlite3.connect(tmp_path / "db")
    assert conn.execute("SELECT count(*) FROM sources").fetchone()[0] == 1


def test_a_dry_run_past_one_batch_counts_every_upload_the_pass_would_forget(
        tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "db", isolation_level=None)
    migrate(conn)
    now, day = time.time(), 86400.0
    for i in range(1, reclaim.BATCH + 51):
        sha = f"{i:064x}"
        conn.execute("INSERT INTO jobs (id, project, name, owner_uid, owner_gid, owner, phase, "
                     "spec, labels, created_at, ended_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                     (i, "p", f"j{i}", 0, 0, "root", "Succeeded",
                      json.dumps({"command": ["true"], "source": sha}), "{}", now - 20 * day,
                      now - 20 * day))
        conn.execute("INSERT INTO sources (sha256, owner_uid, size, created_at) "
                     "VALUES (?,?,?,?)", (sha, 0, 10, now - 20 * day))

    def keep(user: str) -> float | None:
        return 14 * day

    for dry_run in (True, False):
        total, after = reclaim.Reclaimed(), (-1.0, 0)
        while True:
            conn.execute("BEGIN IMMEDIATE")
            found, _ = reclaim.reclaim_due(conn, now, keep, 14 * day, frozenset(), dry_run,
                                         after, frozenset(j.id for j in total.jobs))
            conn.execute("ROLLBACK" if dry_run else "COMMIT")
            total.add(found)
            if found.after is None:
                break
            after = found.after
        assert (len(total.jobs), len(total.sources)) == (reclaim.BATCH + 50,) * 2, dry_run
