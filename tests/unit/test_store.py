"""The SQLite store on disk: migrations, connection settings, the group-commit writer, the
job operations and their transition checks, and the reads. Everything runs against a real
database file under tmp_path."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from noduslocal.daemon.store import Store, job_writes
from noduslocal.daemon.store import rows as records
from noduslocal.daemon.store import writer as writer_module
from noduslocal.daemon.store.migrate import available, migrate, split_statements
from noduslocal.domain import errors
from noduslocal.domain.jobs import CreateRequest, Event, Handle, JobRecord, JobSpec
from noduslocal.domain.states import AttemptPhase, IllegalTransition, Phase, Reason

# `noduslocal.daemon.store` re-exports the function `migrate`, which shadows the submodule of the
# same name as a package attribute; fetch the module itself to patch `available` on it.
migrate_module = importlib.import_module("noduslocal.daemon.store.migrate")

ALICE = job_writes.Owner(uid=1000, gid=1000, name="alice")
BOB = job_writes.Owner(uid=1001, gid=1001, name="bob")
NOW = 1_700_000_000.0


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


@contextlib.asynccontextmanager
async def opened(path: Path, batch_max: int = 256) -> AsyncIterator[tuple[Store, list[Event]]]:
    """An open Store on `path` and the list its on_commit callback appends events to."""
    committed: list[Event] = []
    store = Store(path)
    await store.open(committed.extend, batch_max)
    try:
        yield store, committed
    finally:
        await store.close()


def request(command: tuple[str, ...] = ("echo", "hi"), labels: dict[str, str] | None = None,
            ) -> CreateRequest:
    return CreateRequest(spec=JobSpec(command=list(command)), name=None, project=None,
                         labels=labels or {})


def insert_op(name: str, project: str = "p", owner: job_writes.Owner = ALICE,
              labels: dict[str, str] | None = None, key: str | None = None,
              request_hash: str | None = None, now: float = NOW,
              ) -> Callable[[sqlite3.Connection], tuple[Any, list[Event]]]:
    req = request(labels=labels)
    return lambda c: job_writes.insert_job(c, req, owner, name, project, now, key, request_hash)


async def create(store: Store, name: str, **kwargs: Any) -> JobRecord:
    created: job_writes.Created = await store.write(insert_op(name, **kwargs))
    assert created.created
    return created.job


async def run_to(store: Store, job_id: int, phase: Phase) -> None:
    """Drive a Pending job through its first attempt to Running or to a terminal phase."""
    number = await store.write(lambda c: job_writes.start_attempt(c, job_id, NOW + 1))
    await store.write(lambda c: job_writes.attempt_running(c, job_id, number, NOW + 2))
    if phase is Phase.RUNNING:
        return
    outcome = job_writes.Outcome(AttemptPhase.EXITED, phase,
                          Reason.COMPLETED if phase is Phase.SUCCEEDED else Reason.ERROR,
                          exit_code=0 if phase is Phase.SUCCEEDED else 1)
    await store.write(lambda c: job_writes.finish_attempt(c, job_id, number, outcome, NOW + 3))


def snapshot(path: Path) -> tuple[list[Any], ...]:
    """Every committed row of every table, read on a fresh connection."""
    conn = sqlite3.connect(path)
    try:
        return tuple(conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
                     for table in ("jobs", "attempts", "events"))
    finally:
        conn.close()


def schema(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
    ).fetchall()


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


async def trace_statements(store: Store) -> list[str]:
    """Every SQL statement the writer connection runs from now on."""
    seen: list[str] = []
    assert store._writer_conn is not None
    await store._writer_conn.set_trace_callback(seen.append)
    return seen


# --- migrations --------------------------------------------------------------------------


def test_available_lists_the_shipped_migrations_in_sequence() -> None:
    found = available()
    assert found, "no migration is shipped"
    assert [version for version, _, _ in found] == list(range(1, len(found) + 1))
    assert found[0][1] == "0001_jobs.sql"
    assert all(sql.strip() for _, _, sql in found)


def test_fresh_database_ends_at_the_newest_version(tmp_path: Path) -> None:
    conn = raw(tmp_path / "db.sqlite")
    try:
        assert user_version(conn) == 0
        assert migrate(conn) == len(available())
        assert user_version(conn) == len(available())
        tables = {row[1] for row in schema(conn) if row[0] == "table"}
        assert {"jobs", "attempts", "events"} <= tables
        assert not conn.in_transaction
    finally:
        conn.close()


def test_store_open_migrates_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path):
            pass

    run(body())
    conn = raw(path)
    try:
        assert user_version(conn) == len(available())
    finally:
        conn.close()


def test_migrate_twice_is_a_no_op(tmp_path: Path) -> None:
    conn = raw(tmp_path / "db.sqlite")
    try:
        migrate(conn)
        before = schema(conn)
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        assert migrate(conn) == len(available())
        conn.set_trace_callback(None)
        assert schema(conn) == before
        assert user_version(conn) == len(available())
        assert not [s for s in statements if not s.upper().startswith("PRAGMA USER_VERSION")], \
            f"a second migrate ran {statements}"
    finally:
        conn.close()


def test_database_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    newer = len(available()) + 1
    conn = raw(path)
    try:
        conn.execute(f"PRAGMA user_version = {newer}")
        with pytest.raises(RuntimeError, match="newer"):
            migrate(conn)
        assert user_version(conn) == newer
        assert schema(conn) == []
    finally:
        conn.close()

    async def body() -> None:
        store = Store(path)
        try:
            await store.open(lambda events: None)
        finally:
            await store.close()

    with pytest.raises(RuntimeError, match="newer"):
        run(body())


def test_split_statements_keeps_a_trigger_body_whole() -> None:
    sql = (
        "-- a comment before anything\n"
        "\n"
        "CREATE TABLE t (a INTEGER, b TEXT);\n"
        "CREATE TRIGGER t_audit AFTER INSERT ON t\n"
        "BEGIN\n"
        "    UPDATE t SET b = 'x;y' WHERE a = new.a;\n"
        "    INSERT INTO log VALUES (new.a);\n"
        "END;\n"
        "-- trailing comment\n"
        "INSERT INTO t VALUES (1, 'semi;\n"
        "colon');\n"
    )
    statements = split_statements(sql)
    assert len(statements) == 3
    assert statements[0] == "CREATE TABLE t (a INTEGER, b TEXT);"
    assert "CREATE TRIGGER t_audit" in statements[1]
    assert statements[1].endswith("END;")
    assert "INSERT INTO log VALUES (new.a);" in statements[1]
    assert statements[2].endswith("INSERT INTO t VALUES (1, 'semi;\ncolon');")
    # and the pieces are what SQLite runs one by one
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute("CREATE TABLE log (a INTEGER)")
        for statement in statements:
            conn.execute(statement)
        assert conn.execute("SELECT a, b FROM t").fetchall() == [(1, "x;y")]
        assert conn.execute("SELECT a FROM log").fetchall() == [(1,)]
    finally:
        conn.close()


def test_split_statements_rejects_an_unfinished_statement() -> None:
    with pytest.raises(RuntimeError, match="incomplete"):
        split_statements("CREATE TABLE a (x);\nCREATE TABLE b (y\n")


def _with_extra(sql: str) -> Callable[[], list[tuple[int, str, str]]]:
    shipped = available()
    extra = (len(shipped) + 1, f"{len(shipped) + 1:04d}_broken.sql", sql)
    return lambda: [*shipped, extra]


BROKEN = (
    "CREATE TABLE extra (x INTEGER);\n"
    "INSERT INTO extra VALUES (1);\n"
    "ALTER TABLE jobs ADD COLUMN note TEXT;\n"
    "CREATE TABLE jobs (y INTEGER);\n"  # fails: jobs exists
    "CREATE TABLE never (z INTEGER);\n"
)


def test_a_migration_may_hold_two_statements_on_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(migrate_module, "available",
                        _with_extra("CREATE TABLE a (x); CREATE TABLE b (y);\n"))
    conn = raw(tmp_path / "db.sqlite")
    try:
        assert migrate(conn) == len(available()) + 1
        names = {row[1] for row in schema(conn)}
        assert {"a", "b"} <= names
    finally:
        conn.close()


def test_failed_migration_leaves_version_and_schema_as_they_were(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = raw(tmp_path / "db.sqlite")
    try:
        shipped = migrate(conn)
        before = schema(conn)
        monkeypatch.setattr(migrate_module, "available", _with_extra(BROKEN))
        with pytest.raises(sqlite3.OperationalError, match="already exists"):
            migrate(conn)
        assert user_version(conn) == shipped
        assert schema(conn) == before
        assert not conn.in_transaction
        columns = [row[1] for row in conn.execute("PRAGMA table_info(jobs)")]
        assert "note" not in columns
    finally:
        conn.close()


def test_failed_migration_on_a_fresh_database_keeps_the_good_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "db.sqlite"
    monkeypatch.setattr(migrate_module, "available", _with_extra(BROKEN))

    async def body() -> None:
        async with opened(path):
            pass

    with pytest.raises(sqlite3.OperationalError):
        run(body())
    conn = raw(path)
    try:
        # each migration has its own transaction: the shipped ones stay, the broken one is gone
        assert user_version(conn) == len(available())  # the real, unpatched list
        names = {row[1] for row in schema(conn)}
        assert "jobs" in names
        assert not names & {"extra", "never"}
    finally:
        conn.close()


def test_attempt_handles_are_carried_over_from_the_runtime_columns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempts recorded before 0011 (a shim's pid and boot, a container id) keep what a
    restarted daemon needs to find their ranks again."""
    shipped = available()
    before = next(v for v, name, _ in shipped if name == "0011_attempt_handles.sql") - 1
    monkeypatch.setattr(migrate_module, "available", lambda: shipped[:before])
    conn = raw(tmp_path / "db.sqlite")
    try:
        migrate(conn)
        spec = '{"command": ["true"]}'
        for job_id in (1, 2, 3):
            conn.execute("INSERT INTO jobs (id, project, name, owner_uid, owner_gid, owner, "
                         "phase, spec, labels, created_at) VALUES (?, 'p', ?, 0, 0, 'root', "
                         "'Running', ?, '{}', 0)", (job_id, f"j{job_id}", spec))
        conn.execute("INSERT INTO attempts (job_id, number, phase, created_at, shim_pid, "
                     "boot_id) VALUES (1, 1, 'Running', 0, 4242, 'boot-a')")
        conn.execute("INSERT INTO attempts (job_id, number, phase, created_at, "
                     "container_id) VALUES (2, 1, 'Running', 0, 'c0ffee')")
        conn.execute("INSERT INTO attempts (job_id, number, phase, created_at) "
                     "VALUES (3, 1, 'Starting', 0)")
        monkeypatch.setattr(migrate_module, "available", lambda: shipped)
        assert migrate(conn) == len(shipped)
        rows = conn.execute(f"SELECT {records.ATTEMPT_COLUMNS} FROM attempts ORDER BY job_id")
        handles = [records.attempt_from_row(row).handles for row in rows]
        assert handles == [[Handle("process", "4242", 0, "boot-a")],
                           [Handle("docker", "c0ffee", 0, None)], []]
        columns = {row[1] for row in conn.execute("PRAGMA table_info(attempts)")}
        assert not columns & {"shim_pid", "boot_id", "container_id"}
    finally:
        conn.close()


# --- connection settings -----------------------------------------------------------------


def test_store_uses_wal_full_sync_and_foreign_keys(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, _):
            assert store._writer_conn is not None and store._reader is not None
            writer = store._writer_conn
            assert list(await writer.execute_fetchall("PRAGMA synchronous")) == [(2,)]
            assert list(await writer.execute_fetchall("PRAGMA foreign_keys")) == [(1,)]
            assert list(await writer.execute_fetchall("PRAGMA journal_mode")) == [("wal",)]
            # the reader is read-only
            assert list(await store._reader.execute_fetchall("PRAGMA query_only")) == [(1,)]
            # foreign keys are enforced on the writer: an event for a job that does not exist
            with pytest.raises(sqlite3.IntegrityError):
                await store.write(lambda c: (c.execute(
                    "INSERT INTO events (job_id, at, phase) VALUES (424242, 0, 'Pending')"), []))
            # WAL is a property of the file: a brand-new connection sees it
            conn = sqlite3.connect(path)
            try:
                assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            finally:
                conn.close()

    run(body())


# --- the group-commit writer -------------------------------------------------------------


def test_concurrent_writes_share_commits(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    count = 500

    async def body() -> tuple[list[job_writes.Created], list[str], list[Event]]:
        async with opened(path) as (store, committed):
            statements = await trace_statements(store)

            async def one(i: int) -> job_writes.Created:
                return await store.write(insert_op(f"job-{i}"))

            results = await asyncio.gather(*(one(i) for i in range(count)))
            return results, statements, committed

    results, statements, committed = run(body())
    assert [r.job.name for r in results] == [f"job-{i}" for i in range(count)]
    assert all(r.created for r in results)
    assert len({r.job.id for r in results}) == count
    commits = [s for s in statements if s.strip().upper() == "COMMIT"]
    assert 1 <= len(commits) < count
    jobs, _, events = snapshot(path)
    assert len(jobs) == count
    assert len(events) == count
    assert sorted(e.seq for e in committed) == [row[0] for row in events]


def test_batch_max_bounds_each_commit(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    async def body() -> tuple[list[job_writes.Created], list[str]]:
        async with opened(path, batch_max=10) as (store, _):
            statements = await trace_statements(store)
            futures = [store.write(insert_op(f"job-{i}")) for i in range(25)]
            return list(await asyncio.gather(*futures)), statements

    results, statements = run(body())
    # all 25 were queued before the writer ran: batches of 10, 10 and 5
    assert sum(s.strip().upper() == "COMMIT" for s in statements) == math.ceil(25 / 10)
    assert [r.job.name for r in results] == [f"job-{i}" for i in range(25)]
    assert len(snapshot(path)[0]) == 25


def test_a_failing_op_fails_alone_in_its_batch(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, committed):
            taken = await create(store, "taken")
            done = await create(store, "done")
            await run_to(store, done.id, Phase.SUCCEEDED)
            before = snapshot(path)
            committed.clear()
            statements = await trace_statements(store)

            futures = [
                store.write(insert_op("ok-0")),
                store.write(insert_op("taken", owner=BOB)),  # AlreadyExists
                store.write(insert_op("ok-1")),
                # Succeeded->Starting
                store.write(lambda c: job_writes.start_attempt(c, done.id, NOW)),
                store.write(insert_op("ok-2")),
            ]
            results = await asyncio.gather(*futures, return_exceptions=True)

            assert isinstance(results[1], errors.AlreadyExists)
            assert isinstance(results[3], IllegalTransition)
            good = [results[0], results[2], results[4]]
            assert all(isinstance(r, job_writes.Created) and r.created for r in good)
            assert [r.job.name for r in good] == ["ok-0", "ok-1", "ok-2"]
            assert any(s.strip().upper() == "ROLLBACK" for s in statements)

            jobs, attempts, events = snapshot(path)
            names = [row[2] for row in jobs]
            assert sorted(names) == sorted(["taken", "done", "ok-0", "ok-1", "ok-2"])
            taken_now = await store.job_by_id(taken.id)
            assert taken_now is not None and taken_now.owner == "alice"
            # the failing ops left nothing: the Succeeded job is untouched and only the three
            # good ops wrote events
            assert attempts == before[1]
            assert [row for row in jobs if row[0] in (taken.id, done.id)] == before[0]
            new_events = events[len(before[2]):]
            assert events[:len(before[2])] == before[2]
            assert len(new_events) == 3
            assert {row[1] for row in new_events} == {r.job.id for r in good}
            assert sorted(e.seq for e in committed) == [row[0] for row in new_events]

    run(body())


def test_two_creates_of_one_name_in_one_batch(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    async def body() -> list[Any]:
        async with opened(path) as (store, _):
            futures = [store.write(insert_op("same", owner=ALICE)),
                       store.write(insert_op("same", owner=BOB))]
            return list(await asyncio.gather(*futures, return_exceptions=True))

    first, second = run(body())
    assert isinstance(first, job_writes.Created) and first.created
    assert isinstance(second, errors.AlreadyExists)
    jobs, _, events = snapshot(path)
    assert [(row[2], row[5]) for row in jobs] == [("same", "alice")]
    assert len(events) == 1


def test_close_commits_what_is_queued(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    async def body() -> list[asyncio.Future[Any]]:
        store = Store(path)
        await store.open(lambda events: None)
        futures = [store.write(insert_op(f"job-{i}")) for i in range(10)]
        await store.close()
        return futures

    futures = run(body())
    assert all(f.done() and not f.exception() for f in futures)
    assert len(snapshot(path)[0]) == 10


# --- transitions and their events --------------------------------------------------------


def test_each_transition_writes_one_event(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, committed):
            job = await create(store, "one")
            assert job.phase == Phase.PENDING
            assert [(e.phase, e.reason, e.attempt) for e in await store.events(job_id=job.id)] \
                == [("Pending", "Created", None)]

            number = await store.write(lambda c: job_writes.start_attempt(c, job.id, NOW + 1))
            assert number == 1
            assert len(await store.events(job_id=job.id)) == 2
            attempts = await store.attempts(job.id)
            assert [(a.number, a.phase) for a in attempts] == [(1, "Starting")]

            await store.write(lambda c: job_writes.attempt_running(c, job.id, 1, NOW + 2))
            assert len(await store.events(job_id=job.id)) == 3

            outcome = job_writes.Outcome(AttemptPhase.EXITED, Phase.SUCCEEDED, Reason.COMPLETED,
                                  exit_code=0)
            await store.write(lambda c: job_writes.finish_attempt(c, job.id, 1, outcome, NOW + 3))
            events = await store.events(job_id=job.id)
            assert [(e.phase, e.reason, e.attempt, e.at) for e in events] == [
                ("Pending", "Created", None, NOW),
                ("Starting", "Scheduled", 1, NOW + 1),
                ("Running", "Started", 1, NOW + 2),
                ("Succeeded", "Completed", 1, NOW + 3),
            ]
            assert all((e.project, e.name) == ("p", "one") for e in events)
            # what on_commit heard is exactly what was stored
            assert [(e.seq, e.phase) for e in committed] == [(e.seq, e.phase) for e in events]

            final = await store.job_by_id(job.id)
            assert final is not None
            assert (final.phase, final.reason, final.exit_code, final.attempts) == (
                "Succeeded", "Completed", 0, 1)
            assert (final.started_at, final.ended_at) == (NOW + 2, NOW + 3)
            (attempt,) = await store.attempts(job.id)
            assert (attempt.phase, attempt.started_at, attempt.ended_at, attempt.exit_code) == (
                "Exited", NOW + 2, NOW + 3, 0)

    run(body())


def test_a_lost_attempt_requeues_and_the_next_attempt_counts_on(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, _):
            job = await create(store, "retry")
            await run_to(store, job.id, Phase.RUNNING)
            await store.write(lambda c: job_writes.request_stop(c, job.id, 1, "Timeout"))
            await store.write(lambda c: job_writes.request_stop(c, job.id, 1, "Cancelled"))
            lost = job_writes.Outcome(AttemptPhase.LOST, Phase.PENDING, Reason.LOST,
                                      spend_retry=True)
            await store.write(lambda c: job_writes.finish_attempt(c, job.id, 1, lost, NOW + 4))
            second = await store.write(lambda c: job_writes.start_attempt(c, job.id, NOW + 5))
            assert second == 2
            record = await store.job_by_id(job.id)
            assert record is not None
            assert (record.phase, record.attempts, record.retries_used) == ("Starting", 2, 1)
            assert record.ended_at is None
            attempts = await store.attempts(job.id)
            assert [(a.number, a.phase, a.stop_reason) for a in attempts] == [
                (1, "Lost", "Timeout"), (2, "Starting", None)]
            # request_stop writes no event; every phase change wrote one
            assert [e.phase for e in await store.events(job_id=job.id)] == [
                "Pending", "Starting", "Running", "Pending", "Starting"]

    run(body())


def test_illegal_transitions_raise_and_change_nothing(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    succeeded = job_writes.Outcome(AttemptPhase.EXITED, Phase.SUCCEEDED, Reason.COMPLETED,
                                   exit_code=0)

    async def body() -> None:
        async with opened(path) as (store, committed):
            pending = await create(store, "pending")
            done = await create(store, "done")
            await run_to(store, done.id, Phase.SUCCEEDED)
            starting = await create(store, "starting")
            await store.write(lambda c: job_writes.start_attempt(c, starting.id, NOW + 1))
            before = snapshot(path)
            committed.clear()

            # Pending -> Succeeded without an attempt: there is no attempt to finish
            with pytest.raises(errors.NotFound):
                await store.write(
                    lambda c: job_writes.finish_attempt(c, pending.id, 1, succeeded, NOW))
            # Succeeded -> Running (the attempt is Exited, the job terminal)
            with pytest.raises(IllegalTransition):
                await store.write(lambda c: job_writes.attempt_running(c, done.id, 1, NOW))
            # Succeeded -> Starting
            with pytest.raises(IllegalTransition, match="Succeeded -> Starting"):
                await store.write(lambda c: job_writes.start_attempt(c, done.id, NOW))
            # Succeeded -> Cancelled
            with pytest.raises(IllegalTransition, match="Succeeded -> Cancelled"):
                await store.write(lambda c: job_writes.cancel_pending(c, done.id, NOW, "too late"))
            # Pending -> Running (no attempt was started)
            with pytest.raises(errors.NotFound):
                await store.write(lambda c: job_writes.attempt_running(c, pending.id, 1, NOW))
            # the attempt may go Starting -> Exited, but the job may not go Starting ->
            # Starting: the attempt row was already updated when the job check raised
            odd = job_writes.Outcome(AttemptPhase.EXITED, Phase.STARTING, Reason.PREEMPTED)
            with pytest.raises(IllegalTransition, match="Starting -> Starting"):
                await store.write(lambda c: job_writes.finish_attempt(c, starting.id, 1, odd, NOW))

            assert snapshot(path) == before
            assert committed == []

    run(body())


def test_a_partly_written_failing_op_is_rolled_back_inside_a_batch(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    odd = job_writes.Outcome(AttemptPhase.EXITED, Phase.STARTING, Reason.PREEMPTED)

    async def body() -> None:
        async with opened(path) as (store, _):
            job = await create(store, "starting")
            await store.write(lambda c: job_writes.start_attempt(c, job.id, NOW + 1))
            before = snapshot(path)
            futures = [store.write(insert_op("a")),
                       store.write(lambda c: job_writes.finish_attempt(c, job.id, 1, odd, NOW)),
                       store.write(insert_op("b"))]
            results = await asyncio.gather(*futures, return_exceptions=True)
            assert isinstance(results[1], IllegalTransition)
            assert isinstance(results[0], job_writes.Created)
            assert isinstance(results[2], job_writes.Created)
            jobs, attempts, events = snapshot(path)
            assert attempts == before[1]
            assert [row for row in jobs if row[0] == job.id] == before[0]
            assert len(events) == len(before[2]) + 2

    run(body())


def test_start_attempt_on_a_missing_job_is_not_found(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "db.sqlite") as (store, _):
            with pytest.raises(errors.NotFound):
                await store.write(lambda c: job_writes.start_attempt(c, 4242, NOW))

    run(body())


# --- idempotency -------------------------------------------------------------------------


def test_idempotency_key_returns_the_same_job(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, committed):
            first: job_writes.Created = await store.write(
                insert_op("first", key="k1", request_hash="h1"))
            assert first.created
            # the same request again, even under another generated name: the same job back
            again: job_writes.Created = await store.write(
                insert_op("second", key="k1", request_hash="h1", now=NOW + 10))
            assert not again.created
            assert again.job.id == first.job.id
            assert again.job.name == "first"
            assert again.job.created_at == NOW
            assert len(committed) == 1
            # another request under the same key
            with pytest.raises(errors.Conflict, match="k1"):
                await store.write(insert_op("third", key="k1", request_hash="h2"))
            # keys belong to their owner: bob's k1 is a new job
            bobs: job_writes.Created = await store.write(
                insert_op("bobs", owner=BOB, key="k1", request_hash="h2"))
            assert bobs.created and bobs.job.id != first.job.id
            jobs = await store.jobs()
            assert [j.name for j in jobs] == ["first", "bobs"]
            assert len(await store.events()) == 2

    run(body())


# --- reads -------------------------------------------------------------------------------


def test_jobs_filters(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, _):
            a = await create(store, "a", project="p1", owner=ALICE,
                             labels={"team": "ml", "k8s.io/tier": "gold"})
            b = await create(store, "b", project="p1", owner=BOB, labels={"team": "web"})
            c = await create(store, "c", project="p2", owner=ALICE, labels={"team": "ml"})
            d = await create(store, "d", project="p2", owner=BOB)
            await run_to(store, b.id, Phase.RUNNING)
            await run_to(store, c.id, Phase.SUCCEEDED)
            await store.write(lambda conn: job_writes.cancel_pending(conn, d.id, NOW, "no"))

            async def names(**kwargs: Any) -> list[str]:
                return [j.name for j in await store.jobs(**kwargs)]

            assert await names() == ["a", "b", "c", "d"]
            assert await names(phases=["Pending", "Running"]) == ["a", "b"]
            assert await names(phases=["Succeeded"]) == ["c"]
            assert await names(owner="alice") == ["a", "c"]
            assert await names(owner="carol") == []
            assert await names(project="p2") == ["c", "d"]
            assert await names(labels={"team": "ml"}) == ["a", "c"]
            assert await names(labels={"k8s.io/tier": "gold"}) == ["a"]
            assert await names(labels={"team": "ml"}, project="p1") == ["a"]
            assert await names(labels={"team": "ml", "k8s.io/tier": "silver"}) == []
            assert await names(active_only=True) == ["a", "b"]
            assert await names(active_only=True, owner="bob") == ["b"]
            # the newest `limit`, oldest first
            assert await names(limit=2) == ["c", "d"]
            assert [j.name for j in await store.active_jobs()] == ["a", "b"]

            record = await store.job("p1", "a")
            assert record is not None and record.id == a.id
            assert record.labels == {"team": "ml", "k8s.io/tier": "gold"}
            assert record.spec == JobSpec(command=["echo", "hi"])
            assert await store.job("p2", "a") is None
            assert await store.job_by_id(9999) is None

    run(body())


def test_events_since_are_in_order(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, _):
            x = await create(store, "x", project="p1")
            y = await create(store, "y", project="p2")
            await run_to(store, x.id, Phase.RUNNING)
            await run_to(store, y.id, Phase.FAILED)

            everything = await store.events()
            seqs = [e.seq for e in everything]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) == 2 + 2 + 3
            for cut in range(len(seqs)):
                assert await store.events(since=seqs[cut]) == everything[cut + 1:]
            assert await store.events(since=seqs[-1]) == []
            assert [e.name for e in await store.events(project="p2")] == ["y"] * 4
            assert all(e.job_id == x.id for e in await store.events(job_id=x.id))
            assert await store.events(since=seqs[1], limit=2) == everything[2:4]

    run(body())


def test_writes_survive_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    async def write() -> tuple[JobRecord, list[Event]]:
        async with opened(path) as (store, _):
            job = await create(store, "durable", labels={"k": "v"})
            await run_to(store, job.id, Phase.FAILED)
            record = await store.job_by_id(job.id)
            assert record is not None
            return record, await store.events()

    async def read() -> tuple[JobRecord | None, list[Event], int]:
        async with opened(path) as (store, _):
            return (await store.job("p", "durable"), await store.events(),
                    len(await store.attempts(1)))

    written, events = run(write())
    reread, events_again, attempts = run(read())
    assert reread == written
    assert reread is not None and (reread.phase, reread.exit_code) == ("Failed", 1)
    assert events_again == events
    assert attempts == 1


def test_the_migration_gives_old_canaries_their_sweep_and_no_one_elses_job() -> None:
    """Schema 22 backfills canary_of from the sweep's spec and the owner's own tries; a
    stranger's job with the label and a try's name stays nobody's canary."""
    import sqlite3

    from noduslocal.daemon.store.migrate import available, migrate, split_statements

    conn = sqlite3.connect(":memory:", isolation_level=None)
    for version, _, sql in available()[:21]:
        for statement in split_statements(sql):
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version}")
    conn.execute("INSERT INTO sweeps (id, project, name, owner_uid, owner_gid, owner, phase, "
                 "spec, labels, cells, max_parallel, created_at) VALUES (7, 'team', 'gate', "
                 "1001, 1001, 'alice', 'Failed', '{\"smoke_job\": 12}', '{}', 1, 1, 0)")
    for job_id, uid, name in ((10, 1001, "gate-canary"), (11, 1002, "gate-canary-r2"),
                              (12, 1001, "gate-canary-r3"), (13, 1001, "other")):
        conn.execute("INSERT INTO jobs (id, project, name, owner_uid, owner_gid, owner, "
                     "phase, spec, labels, created_at) VALUES (?, 'team', ?, ?, ?, 'x', "
                     "'Failed', '{}', '{\"sweep\": \"gate\"}', 0)", (job_id, name, uid, uid))
    assert migrate(conn) >= 22
    rows = dict(conn.execute("SELECT id, canary_of FROM jobs").fetchall())
    assert rows == {10: 7, 11: None, 12: 7, 13: None}


def test_an_attempt_costs_one_statement_per_row_it_changes(tmp_path: Path) -> None:
    """A legal transition is one UPDATE whose WHERE checks the table (no SELECT first):
    start, Running and end of a first attempt are 9 statements, not 17 (issue 25 part 5);
    a second attempt's Running keeps the job's first start, and its end replaces the
    outputs an earlier attempt left."""
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, _):
            job = await create(store, "lean")
            statements = await trace_statements(store)
            await run_to(store, job.id, Phase.RUNNING)
            lost = job_writes.Outcome(AttemptPhase.LOST, Phase.PENDING, Reason.LOST,
                                      spend_retry=True)
            await store.write(lambda c: job_writes.finish_attempt(c, job.id, 1, lost, NOW + 3))
            work = [s for s in statements if not s.startswith(("BEGIN", "COMMIT", "PRAGMA"))]
            assert len(work) == 9, work
            assert not any(s.startswith("SELECT") for s in work)

            await store.write(lambda c: job_writes.start_attempt(c, job.id, NOW + 4))
            await store.write(lambda c: job_writes.attempt_running(c, job.id, 2, NOW + 5))
            statements.clear()
            done = job_writes.Outcome(AttemptPhase.EXITED, Phase.SUCCEEDED, Reason.COMPLETED,
                                      exit_code=0)
            await store.write(lambda c: job_writes.finish_attempt(c, job.id, 2, done, NOW + 6))
            assert any(s.startswith("DELETE FROM outputs") for s in statements)
            record = await store.job_by_id(job.id)
            assert record is not None
            assert (record.phase, record.attempts, record.retries_used) == ("Succeeded", 2, 1)
            assert (record.started_at, record.ended_at) == (NOW + 2, NOW + 6)

    run(body())


def test_a_lazy_write_rides_with_the_next_commit_or_goes_after_its_delay(
        tmp_path: Path) -> None:
    """write_lazily(): an attempt's Running joins the commit of the next write (its end,
    for a short task) in order before it; alone, it commits within writer.LAZY_DELAY."""
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, committed):
            job = await create(store, "lazy")
            number = await store.write(lambda c: job_writes.start_attempt(c, job.id, NOW))
            statements = await trace_statements(store)
            committed.clear()
            running = store.write_lazily(lambda c: job_writes.attempt_running(
                c, job.id, number, NOW + 1))
            await asyncio.sleep(0)
            assert statements == [] and not running.done()
            done = job_writes.Outcome(AttemptPhase.EXITED, Phase.SUCCEEDED, Reason.COMPLETED,
                                      exit_code=0)
            await store.write(lambda c: job_writes.finish_attempt(c, job.id, number, done,
                                                                  NOW + 2))
            assert running.done()
            assert statements.count("BEGIN IMMEDIATE") == 1
            assert [e.phase for e in committed] == ["Running", "Succeeded"]

            other = await create(store, "alone")
            number = await store.write(lambda c: job_writes.start_attempt(c, other.id, NOW))
            alone = store.write_lazily(lambda c: job_writes.attempt_running(
                c, other.id, number, NOW + 1))
            await asyncio.wait_for(alone, 10)
            record = await store.job_by_id(other.id)
            assert record is not None and record.phase == "Running"

    run(body())


def test_a_running_written_with_its_end_leaves_what_two_writes_leave(tmp_path: Path) -> None:
    """finish_attempt(started=...): a short task's Running, taken back from the queue
    (withdraw), goes in its end's rows: the same rows and events, in order with their own
    times and consecutive seqs, in two UPDATEs and one INSERT, not five statements
    (issue 25 part 5)."""
    path = tmp_path / "db.sqlite"
    handles = [Handle("process", "123", 0, "boot-a")]
    done = job_writes.Outcome(AttemptPhase.EXITED, Phase.SUCCEEDED, Reason.COMPLETED,
                              exit_code=0)

    async def body() -> None:
        async with opened(path) as (store, committed):
            apart = await create(store, "apart")
            number = await store.write(lambda c: job_writes.start_attempt(c, apart.id, NOW))
            await store.write(lambda c: job_writes.attempt_running(c, apart.id, number,
                                                                   NOW + 1, handles))
            await store.write(lambda c: job_writes.finish_attempt(c, apart.id, number, done,
                                                                  NOW + 2))

            merged = await create(store, "merged")
            number = await store.write(lambda c: job_writes.start_attempt(c, merged.id, NOW))
            running = store.write_lazily(lambda c: job_writes.attempt_running(
                c, merged.id, number, NOW + 1, handles))
            assert store.withdraw(running)
            assert not store.withdraw(running)  # taken already: nothing to take twice
            statements = await trace_statements(store)
            committed.clear()
            started = job_writes.Started(NOW + 1, handles)
            await store.write(lambda c: job_writes.finish_attempt(
                c, merged.id, number, done, NOW + 2, started=started))
            work = [s for s in statements if not s.startswith(("BEGIN", "COMMIT", "PRAGMA"))]
            assert len(work) == 3, work
            assert not running.done()  # its caller answers it (runner.finish)

            def shape(events: list[Event]) -> list[tuple[Any, ...]]:
                return [(e.phase, e.reason, e.attempt, e.at) for e in events]

            assert shape(await store.events(job_id=merged.id)) == shape(
                await store.events(job_id=apart.id))
            assert [e.phase for e in committed] == ["Running", "Succeeded"]
            stored = await store.events(job_id=merged.id)
            assert [(e.seq, e.phase) for e in committed] == [(e.seq, e.phase)
                                                             for e in stored[-2:]]
            assert committed[1].seq == committed[0].seq + 1
            for one, other in zip(await store.attempts(apart.id),
                                  await store.attempts(merged.id), strict=True):
                assert (one.phase, one.started_at, one.ended_at, one.exit_code,
                        one.handles) == (other.phase, other.started_at, other.ended_at,
                                         other.exit_code, other.handles)
            a, m = await store.job_by_id(apart.id), await store.job_by_id(merged.id)
            assert a is not None and m is not None
            assert (a.phase, a.started_at, a.ended_at, a.exit_code) == (
                m.phase, m.started_at, m.ended_at, m.exit_code)

    run(body())


def test_a_running_written_with_its_end_still_checks_the_transitions(tmp_path: Path) -> None:
    """The merged write requires what Running requires (a Starting attempt and job), and
    may_end_running() refuses an outcome Running may not lead to."""
    path = tmp_path / "db.sqlite"
    done = job_writes.Outcome(AttemptPhase.EXITED, Phase.SUCCEEDED, Reason.COMPLETED,
                              exit_code=0)
    assert job_writes.may_end_running(done)
    assert not job_writes.may_end_running(job_writes.Outcome(
        AttemptPhase.EXITED, Phase.STARTING, Reason.COMPLETED))

    async def body() -> None:
        async with opened(path) as (store, _):
            job = await create(store, "ran")
            await run_to(store, job.id, Phase.RUNNING)  # Running already: not from Starting
            before = snapshot(path)
            with pytest.raises(IllegalTransition):
                await store.write(lambda c: job_writes.finish_attempt(
                    c, job.id, 1, done, NOW + 5, started=job_writes.Started(NOW + 4)))
            assert snapshot(path) == before

    run(body())


def test_a_quick_batch_runs_on_the_loop_and_commits_on_the_thread(tmp_path: Path) -> None:
    """Quick operations (an attempt's start and end) run their statements on the event
    loop and only the COMMIT on the writer's thread (issue 25 part 5). One that fails
    fails alone, as in any batch. While another connection holds the write lock, the loop
    does not wait for it: the batch goes to the thread, which does, and commits once the
    lock is released."""
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, committed):
            loop_thread = threading.get_ident()
            jobs = [await create(store, f"q{i}") for i in range(3)]
            done = await create(store, "done")
            await run_to(store, done.id, Phase.SUCCEEDED)
            seen: list[tuple[str, bool]] = []
            assert store._writer_conn is not None
            await store._writer_conn.set_trace_callback(
                lambda sql: seen.append((sql, threading.get_ident() == loop_thread)))
            committed.clear()
            results = await asyncio.gather(*[
                store.write(lambda c, job_id=job.id: job_writes.start_attempt(c, job_id, NOW),
                            quick=True) for job in jobs[:2]])
            assert results == [1, 1]
            assert seen[0] == ("BEGIN IMMEDIATE", True) and seen[-1] == ("COMMIT", False)
            assert all(on_loop for _, on_loop in seen[:-1])
            assert sorted(e.job_id for e in committed) == sorted(job.id for job in jobs[:2])
            results = await asyncio.gather(
                store.write(lambda c: job_writes.start_attempt(c, jobs[2].id, NOW),
                            quick=True),
                store.write(lambda c: job_writes.start_attempt(c, done.id, NOW), quick=True),
                return_exceptions=True)
            assert results[0] == 1 and isinstance(results[1], IllegalTransition)
            record = await store.job_by_id(done.id)
            assert record is not None and record.phase == "Succeeded"

            blocker = sqlite3.connect(path, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")
            seen.clear()
            running = store.write(lambda c: job_writes.attempt_running(
                c, jobs[0].id, 1, NOW + 1), quick=True)
            await asyncio.sleep(0.3)  # the loop goes on meanwhile: this sleep returns
            assert not running.done()
            blocker.execute("COMMIT")
            blocker.close()
            await asyncio.wait_for(running, 10)
            assert ("PRAGMA busy_timeout = 5000", False) in seen
            record = await store.job_by_id(jobs[0].id)
            assert record is not None and record.phase == "Running"

    run(body())



@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each fdatasync the writer makes itself: True where the event loop's thread made it."""
    made: list[bool] = []
    loop_thread = threading.get_ident()
    real = writer_module.os.fdatasync

    def recorded(fd: int) -> None:
        made.append(threading.get_ident() == loop_thread)
        real(fd)

    monkeypatch.setattr(writer_module.os, "fdatasync", recorded)
    return made


def test_volatile_quick_batches_commit_on_the_loop_and_are_synced_on_the_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: list[bool]) -> None:
    """An attempt's start, Running and end on this box (`volatile`) commit whole on the
    loop with synchronous=NORMAL and no autocheckpoint; every CHECKPOINT_EVERY of them a
    checkpoint and an fdatasync of the WAL run on the thread (a checkpoint's cursor left
    open once failed every 64th COMMIT: "SQL statements in progress"). The first write
    after a checkpoint or a FULL batch may start the WAL over, which syncs its header: it
    commits on the thread. A quick batch with one durable operation commits FULL on the
    thread. A clean close leaves all of it in the file."""
    monkeypatch.setattr(writer_module, "SYNC_WITHIN", 600.0)  # only the count here
    path = tmp_path / "db.sqlite"
    count = writer_module.CHECKPOINT_EVERY * 3 + 5

    async def body() -> None:
        async with opened(path) as (store, _):
            loop_thread = threading.get_ident()
            jobs = [await create(store, f"v{i}") for i in range(count)]
            seen: list[tuple[str, bool]] = []
            assert store._writer_conn is not None
            await store._writer_conn.set_trace_callback(
                lambda sql: seen.append((sql, threading.get_ident() == loop_thread)))
            for job in jobs:  # one commit each, as a sweep of short tasks makes them
                assert await store.write(
                    lambda c, job_id=job.id: job_writes.start_attempt(c, job_id, NOW),
                    quick=True, volatile=True) == 1
            assert ("PRAGMA synchronous = NORMAL", True) in seen
            assert ("PRAGMA wal_autocheckpoint = 0", True) in seen
            steps = [(sql, on_loop) for sql, on_loop in seen
                     if sql == "COMMIT" or "wal_checkpoint" in sql]
            checkpoints = [on_loop for sql, on_loop in steps if "wal_checkpoint" in sql]
            assert len(checkpoints) == count // writer_module.CHECKPOINT_EVERY
            assert not any(checkpoints) and syncs == [False] * len(checkpoints)
            # After the FULL creates, and after each checkpoint: on the thread.
            fresh = [0] + [i + 1 for i, (sql, _) in enumerate(steps) if "wal_checkpoint" in sql]
            for i, (sql, on_loop) in enumerate(steps):
                if sql == "COMMIT":
                    assert on_loop is (i not in fresh), (i, steps[max(0, i - 2):i + 2])
            seen.clear()
            await create(store, "durable")
            assert seen[0] == ("PRAGMA synchronous = FULL", True)
            assert ("COMMIT", False) in seen
            seen.clear()
            await asyncio.gather(
                store.write(lambda c: job_writes.attempt_running(c, jobs[0].id, 1, NOW),
                            quick=True, volatile=True),
                store.write(lambda c: job_writes.attempt_running(c, jobs[1].id, 1, NOW),
                            quick=True))
            assert ("COMMIT", False) in seen and ("COMMIT", True) not in seen
            await store.write(lambda c: job_writes.attempt_running(c, jobs[2].id, 1, NOW),
                              quick=True, volatile=True)
            syncs.clear()
        assert syncs == [False]  # the close made the last one durable, on the thread
        conn = raw(path)
        try:
            phases = dict(conn.execute("SELECT name, phase FROM jobs").fetchall())
        finally:
            conn.close()
        assert [phases[f"v{i}"] for i in range(3)] == ["Running"] * 3
        assert all(phases[f"v{i}"] == "Starting" for i in range(3, count))

    run(body())


def test_a_volatile_commit_is_on_the_disk_within_sync_within(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: list[bool]) -> None:
    """A lone end on the loop does not wait for CHECKPOINT_EVERY more to be synced: a job
    that ended a second before a power loss keeps its end. A FULL write meanwhile that
    failed, or wrote nothing, does not stand for that sync (it once cancelled it)."""
    monkeypatch.setattr(writer_module, "SYNC_WITHIN", 0.2)
    path = tmp_path / "db.sqlite"

    def refused(c: sqlite3.Connection) -> tuple[Any, list[Event]]:
        raise errors.Conflict("no")

    def nothing(c: sqlite3.Connection) -> tuple[Any, list[Event]]:
        c.execute("UPDATE jobs SET name = name WHERE 0")
        return None, []

    async def body() -> None:
        async with opened(path) as (store, _):
            job = await create(store, "s")
            await store.write(lambda c: job_writes.start_attempt(c, job.id, NOW),
                              quick=True, volatile=True)
            assert syncs == []
            with pytest.raises(errors.Conflict):
                await store.write(refused)
            await store.write(nothing)
            deadline = asyncio.get_running_loop().time() + 10
            while not syncs and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            assert syncs == [False]

    run(body())


def test_a_failed_sync_of_the_wal_is_tried_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "SYNC_WITHIN", 0.1)
    tries: list[int] = []
    real = writer_module.os.fdatasync

    def flaky(fd: int) -> None:
        tries.append(fd)
        if len(tries) == 1:
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(writer_module.os, "fdatasync", flaky)
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, _):
            job = await create(store, "f")
            await store.write(lambda c: job_writes.start_attempt(c, job.id, NOW),
                              quick=True, volatile=True)
            deadline = asyncio.get_running_loop().time() + 10
            while len(tries) < 2 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            assert len(tries) == 2
            assert store._writer is not None and not store._writer._unsynced

    run(body())


def test_a_checkpoint_that_fails_still_syncs_the_wal(
        tmp_path: Path, syncs: list[bool]) -> None:
    path = tmp_path / "db.sqlite"
    conn = raw(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (a)")
    conn.execute("INSERT INTO t VALUES (1)")
    closed = sqlite3.connect(path)
    closed.close()  # its execute raises sqlite3.ProgrammingError
    try:
        writer_module._checkpoint_and_sync(closed, f"{path}-wal")
    finally:
        conn.close()
    assert syncs == [True]  # made here, on this (the test's) thread


def test_a_commit_waits_one_turn_of_the_loop_for_what_is_ready(tmp_path: Path) -> None:
    """What is ready to run when a write wakes the writer runs before its commit: an armed
    attempt queues its start, and its task lets the shim go before that start commits
    (runner.py's _launch_armed); a write it queues meanwhile joins the same commit."""
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, _):
            job = await create(store, "turn")
            statements = await trace_statements(store)
            seen: list[int] = []

            def ready() -> None:  # queued after the write: it runs before the commit
                seen.append(statements.count("COMMIT"))
                store.write(lambda c: job_writes.attempt_running(c, job.id, 1, NOW + 1),
                            quick=True, volatile=True)

            started = store.write(lambda c: job_writes.start_attempt(c, job.id, NOW),
                                  quick=True, volatile=True)
            asyncio.get_running_loop().call_soon(ready)
            assert await started == 1
            assert seen == [0]
            assert statements.count("COMMIT") == 1  # the start and its Running, together
            record = await store.job_by_id(job.id)
            assert record is not None and record.phase == "Running"

    run(body())


def test_a_connection_that_fails_fails_every_write_of_its_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a disk without room (that batch waits), and no operation's own error: each
    write of the batch gets the connection's error. Before, the batch's items were
    unpacked in threes and the writer's task died with a ValueError instead."""
    path = tmp_path / "db.sqlite"

    async def body() -> None:
        async with opened(path) as (store, _):
            assert store._writer is not None
            real = store._writer._conn._execute

            async def broken(fn: Any, *args: Any) -> Any:
                raise sqlite3.OperationalError("disk I/O error")

            monkeypatch.setattr(store._writer._conn, "_execute", broken)
            writes = [store.write(insert_op(f"j{i}")) for i in range(3)]
            results = await asyncio.wait_for(asyncio.gather(*writes, return_exceptions=True),
                                             10)
            assert all(isinstance(r, sqlite3.OperationalError) for r in results), results
            monkeypatch.setattr(store._writer._conn, "_execute", real)
            assert (await store.write(insert_op("after"))).created  # the writer goes on

    run(body())
