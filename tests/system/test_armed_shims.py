"""Armed shims (issue 25, part 5): a sweep's next cells launched ahead and held before they
touch their attempt directory, let go at their start; let go for good when their start does
not come, when the daemon or its spawner goes, or when their hold runs out. Real spawners,
shims and jobs; a real daemon for the sweep and for a start whose commit was lost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from noduslocal import testing
from noduslocal.daemon.config.settings import SYSTEM_DATA_DIR
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.jobs import orphans
from noduslocal.daemon.jobs.orphans import lost_starts
from noduslocal.daemon.runtime import compiled_shim, shim
from noduslocal.daemon.runtime.attempt_dir import read_pid
from noduslocal.daemon.runtime.base import AttemptRef, Exited, GpuGrant, Launch
from noduslocal.daemon.runtime.host import runtime as host_runtime
from noduslocal.daemon.runtime.host.cgroups import ROOT, Cgroups, cgroup_name, parent_name
from noduslocal.daemon.runtime.host.runtime import HostRuntime
from noduslocal.daemon.runtime.host.spawner import Spawner
from noduslocal.domain.jobs import JobRecord, JobSpec
from noduslocal.testing import process_gone as gone
from tests.unit.test_cgroups import v1_tree

PATH = "/usr/local/bin:/usr/bin:/bin"
DEADLINE = 15.0


@pytest.fixture
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    found = compiled_shim.find(tmp_path_factory.getbasetemp() / "shim-data")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("no compiled shim: scripts/test.sh builds it (needs gcc)")
        pytest.skip("no C compiler for the compiled shim (the Python one cannot be held)")
    return found


def held_request(directory: Path, argv: list[str], hold: int = 60) -> dict[str, Any]:
    return {"dir": str(directory), "argv": argv, "env": {"PATH": PATH},
            "cwd": str(directory), "uid": None, "hold": hold}


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_an_armed_shim_touches_nothing_until_its_go(tmp_path: Path, binary: Path) -> None:
    directory = tmp_path / "attempt"
    directory.mkdir()

    async def body() -> Exited:
        spawner = Spawner(binary)
        await spawner.start()
        try:
            pid = await spawner.launch(held_request(directory, ["sh", "-c", "echo ran"]))
            await asyncio.sleep(0.3)
            assert not gone(pid) and list(directory.iterdir()) == []
            pidfd = os.pidfd_open(pid)
            signal.pidfd_send_signal(pidfd, signal.SIGUSR1)
            state = await asyncio.wait_for(spawner.watch(directory, pid, pidfd), DEADLINE)
            assert isinstance(state, Exited)
            return state
        finally:
            await spawner.close()

    state = asyncio.run(body())
    assert (state.exit_code, state.signal) == (0, None)
    record = read_pid(directory)
    assert record is not None and record["armed"] is True  # recovery reads it (orphans.py)
    assert (directory / shim.OUTPUT_LOG).read_text() == "ran\n"


@pytest.mark.parametrize("ending", ["let go", "spawner gone", "hold over"])
def test_an_armed_shim_that_gets_no_go_exits_having_done_nothing(
        tmp_path: Path, binary: Path, ending: str) -> None:
    """Told so (SIGUSR2), its spawner gone (the daemon with it: its parent-death signal),
    or its hold over: it exits, and the directory is as it was (a later launch there, or
    a recovery, finds no start)."""
    directory = tmp_path / "attempt"
    directory.mkdir()
    ran = tmp_path / "ran"

    async def body() -> int:
        spawner = Spawner(binary)
        await spawner.start()
        try:
            pid = await spawner.launch(held_request(
                directory, ["sh", "-c", f"touch {ran}"], hold=1 if ending == "hold over" else 60))
            await asyncio.sleep(0.2)
            assert not gone(pid)
            if ending == "let go":
                os.kill(pid, signal.SIGUSR2)
            elif ending == "spawner gone":
                await spawner.close()
            return pid
        finally:
            await spawner.close()

    pid = asyncio.run(body())
    wait_for(lambda: gone(pid), "the armed shim to exit")
    assert list(directory.iterdir()) == [] and not ran.exists()


def job(job_id: int, uid: int = 0) -> JobRecord:
    return JobRecord(id=job_id, project="p", name=f"j{job_id}", owner_uid=uid, owner_gid=uid,
                     owner="root" if uid == 0 else "someone", phase="Pending",
                     spec=JobSpec(command=["sh", "-c", "echo $NODUS_ATTEMPT"]), labels={},
                     created_at=0.0)


def launch_of(layout: JobLayout, record: JobRecord) -> Launch:
    layout.workspace(record.id).mkdir(parents=True, exist_ok=True)
    directory = layout.attempt_dir(record.id, 1)
    directory.mkdir(parents=True, exist_ok=True)
    return Launch(AttemptRef(record, 1, directory), {}, GpuGrant())


@pytest.fixture
def quick_expiry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(host_runtime, "ARM_TTL", 0.2)
    yield


@pytest.fixture
def one_cpu(binary: Path) -> Iterator[testing.Daemon]:
    """A started daemon of one CPU, its cells armed by the compiled shim (found as
    `binary` found it), for the tests that kill it -9."""
    del binary
    with testing.daemon(cpus=1, memory="4GiB") as d:
        yield d


def test_the_runtime_lets_an_armed_launch_go_at_its_start_and_others_at_their_expiry(
        tmp_path: Path, binary: Path, quick_expiry: None) -> None:
    layout = JobLayout(tmp_path)

    async def body() -> None:
        runtime = HostRuntime(layout, Spawner(binary))
        await runtime.spawner.start()
        try:
            started, unstarted = launch_of(layout, job(7)), launch_of(layout, job(8))
            assert runtime.arm(started) and runtime.arm(unstarted)
            assert not runtime.arm(started)  # armed already
            await testing.eventually(lambda: runtime.armed(7, 1) and runtime.armed(8, 1),
                                     "both to be armed")
            held = (await runtime._armed[(7, 1)]).pid  # type: ignore[union-attr]
            [rank] = await runtime.launch(started)
            assert rank.handle.ref == str(held)  # the armed shim, let go
            end = await asyncio.wait_for(rank.ended, DEADLINE)
            assert isinstance(end, Exited) and end.exit_code == 0
            other = (await runtime._armed[(8, 1)]).pid  # type: ignore[union-attr]
            await testing.eventually(lambda: not runtime.holds(8, 1) and gone(other),
                                     "the unstarted one to be let go", timeout=DEADLINE)
            assert list(layout.attempt_dir(8, 1).iterdir()) == []
        finally:
            await runtime.close()

    asyncio.run(body())
    assert (layout.attempt_dir(7, 1) / shim.OUTPUT_LOG).read_text() == "1\n"


def test_a_rank_whose_shim_saw_its_cgroups_empty_is_pooled_on_its_word(
        tmp_path: Path, binary: Path) -> None:
    """A shim reads its rank's cgroups after the job's end and says in its exit record that
    it saw them empty; the release then keeps them for the next rank without reading them
    again (issue 25 part 5), for an armed launch and a plain one alike. The cgroups are a
    scratch v1 tree: a pid written into them after the ends would keep them out of the
    pool, were the release to read them."""
    layout = JobLayout(tmp_path / "data")
    root = tmp_path / "cgroup"
    names = [cgroup_name(job_id, 1, 0) for job_id in (7, 8)]
    for name in names:
        v1_tree(root, "nl", name)
        for controller in ("cpu", "pids"):  # where the job's process enters itself
            (root / controller / "nl" / name / "tasks").touch()
    cgroups = Cgroups.detect("nl", root)

    async def body() -> None:
        runtime = HostRuntime(layout, Spawner(binary), cgroups)
        await runtime.spawner.start()
        try:
            armed, plain = launch_of(layout, job(7)), launch_of(layout, job(8))
            assert runtime.arm(armed)
            await testing.eventually(lambda: runtime.armed(7, 1), "the arming")
            handles = []
            for launch in (armed, plain):
                [rank] = await runtime.launch(launch)
                end = await asyncio.wait_for(rank.ended, DEADLINE)
                assert isinstance(end, Exited) and end.exit_code == 0 and end.cgroups_empty
                handles.append(rank.handle)
            for name in names:
                for controller in ("cpu", "pids"):
                    (root / controller / "nl" / name / "cgroup.procs").write_text("4242\n")
            for launch, handle in zip((armed, plain), handles, strict=True):
                await runtime.release(launch.ref, [handle])
            assert sorted(p.parent.parent.name for p in root.glob("*/nl/idle-*")) == [
                "cpu", "cpu", "pids", "pids"]
        finally:
            await runtime.close()

    asyncio.run(body())


def test_armed_shims_are_capped_per_owner_and_only_for_what_can_be_held(
        tmp_path: Path, binary: Path) -> None:
    layout = JobLayout(tmp_path)

    async def body() -> None:
        runtime = HostRuntime(layout, Spawner(binary))
        python = HostRuntime(layout, Spawner(None))
        await runtime.spawner.start()
        try:
            armed = [runtime.arm(launch_of(layout, job(i, uid=1000))) for i in range(1, 7)]
            assert armed == [True] * host_runtime.ARMED_PER_USER + [False] * (
                6 - host_runtime.ARMED_PER_USER)
            assert runtime.arm(launch_of(layout, job(20, uid=1001)))  # another owner's lane
            assert not python.armable(launch_of(layout, job(30)))  # shim.py cannot hold
            gpu = launch_of(layout, job(31))
            granted = Launch(gpu.ref, {}, GpuGrant(["GPU-0"]))
            assert not runtime.armable(granted)  # its GPUs are chosen at its start
            record = job(32)
            outside = Launch(AttemptRef(
                replace(record, spec=replace(record.spec, checkpoint="/ckpt")), 1,
                layout.attempt_dir(32, 1)), {}, GpuGrant())
            assert not runtime.namespaces.enabled
            assert not runtime.armable(outside)  # its launch refuses it, and says why
        finally:
            await runtime.close()

    asyncio.run(body())


def test_a_maps_cells_are_armed_and_each_runs_once(tmp_path: Path, binary: Path) -> None:
    del binary  # the daemon finds it as the fixture did
    runs = tmp_path / "runs"
    runs.mkdir()
    with testing.daemon(cpus=2) as d:
        client = d.client()
        client.create_sweep({"name": "armed", "canary": "none", "max_parallel": 2,
                             "template": {"command": ["sh", "-c", f"echo $$ >> {runs}/$X"],
                                          "cpu": 1},
                             "grid": {"X": [str(i) for i in range(40)]}})
        assert client.wait_sweep("armed", timeout=120)["phase"] == "Succeeded"
        records = [read_pid(p) for p in d.data_dir.glob("jobs/*/attempt-1")]
        assert sum(1 for r in records if r is not None and r.get("armed")) >= 20, records
        assert all(len((runs / str(i)).read_text().split()) == 1 for i in range(40))
        assert not any(j["attempts"] != 1 for j in client.list_jobs(sweep="armed", all=True))


def test_an_armed_start_the_database_lost_is_put_back_as_no_damage(
        tmp_path: Path, one_cpu: testing.Daemon) -> None:
    """An armed cell is let go as its start is queued, before that start commits; a daemon
    killed -9 in between leaves a database without the start. The start is put back from
    the cell's records as any lost one, but the record says it was armed: no damage is
    reported, and the cell is not run again."""
    d, client = one_cpu, one_cpu.client()
    release, ran = tmp_path / "release", tmp_path / "ran"
    client.create_sweep({
        "name": "lost", "canary": "none", "max_parallel": 1,
        "template": {"cpu": 1, "command": [
            "sh", "-c", f'if [ "$X" = 0 ]; then while [ ! -e {release} ]; do '
            f'sleep 0.05; done; else echo once >> {ran}; echo out; exit 4; fi']},
        "grid": {"X": ["0", "1"]}})
    testing.wait_until(lambda: client.get_job("lost-0")["phase"] == "Running",
                       "the first cell to run")
    time.sleep(1.0)  # the second one read ahead and armed
    assert client.get_job("lost-1")["phase"] == "Pending"
    saved = tmp_path / "saved.db"
    save_database(d, saved)  # as it was before the second cell started
    release.touch()
    assert client.wait_job("lost-1", timeout=DEADLINE)["exit_code"] == 4
    [record] = [r for p in d.data_dir.glob("jobs/*/attempt-1")
                if (r := read_pid(p)) is not None and r.get("exit_code") == 4]
    assert record.get("armed") is True, record
    put_back_database(d, saved)

    d.start()
    cell = client.wait_job("lost-1", timeout=DEADLINE)
    assert (cell["phase"], cell["exit_code"], cell["attempts"]) == ("Failed", 4, 1), cell
    assert ran.read_text() == "once\n"
    health = client.transport.request("GET", "/v1/health")
    assert not health.get("problems"), health
    assert "was let go as its start was queued" in d.log()
    assert " ERROR " not in d.log()


def job_id_of(db: Path, name: str) -> int:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        [(job_id,)] = conn.execute("SELECT id FROM jobs WHERE name = ?", (name,))
    return int(job_id)


def put_back_database(d: testing.Daemon, saved: Path) -> None:
    """The daemon killed -9 and its database as `saved` had it: the commits since lost,
    as when the kill came before they were made."""
    d.kill()
    db = d.data_dir / "noduslocal.db"
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    shutil.copy(saved, db)


def save_database(d: testing.Daemon, saved: Path) -> None:
    with contextlib.closing(sqlite3.connect(d.data_dir / "noduslocal.db")) as source, \
            contextlib.closing(sqlite3.connect(saved)) as copy:
        source.backup(copy)


@pytest.mark.parametrize("left", ["its attempt directory", "its workspace alone"])
def test_a_first_attempt_prepared_but_never_started_before_a_kill_runs_after_it(
        tmp_path: Path, one_cpu: testing.Daemon, left: str) -> None:
    """An armed start makes the attempt's directories before its start commits (and lets
    its shim go after): a kill -9 in between leaves them, with the volume's link in the
    workspace, and no start. The next daemon must run the job, not fail it "File exists"
    (the chaos test's cells did, 1 run in 60 under load). With the attempt's directory
    there (the shim may have been let go), it is marked abandoned and its number spent as
    not started; with the workspace alone (the kill came while it was made), it is made
    again for attempt 1."""
    d, client = one_cpu, one_cpu.client()
    release, ran = tmp_path / "release", tmp_path / "ran"
    saved = tmp_path / "saved.db"
    client.create_volume("v")
    client.create_sweep({
        "name": "cut", "canary": "none", "max_parallel": 1,
        "template": {"cpu": 1, "volumes": {"v": "v"}, "command": [
            "sh", "-c", f'if [ "$X" = 0 ]; then while [ ! -e {release} ]; do '
            f'sleep 0.05; done; else echo "$NODUS_ATTEMPT" >> {ran}; fi']},
        "grid": {"X": ["0", "1"]}})
    testing.wait_until(lambda: client.get_job("cut-0")["phase"] == "Running",
                       "the first cell to run")
    save_database(d, saved)  # the second cell pending, nothing of it committed
    release.touch()
    assert client.wait_sweep("cut", timeout=DEADLINE)["phase"] == "Succeeded"
    put_back_database(d, saved)
    job_dir = d.data_dir / "jobs" / str(job_id_of(saved, "cut-1"))
    attempt = job_dir / "attempt-1"
    shutil.rmtree(attempt)  # what the kill left: no start recorded in it
    if left == "its attempt directory":
        attempt.mkdir(mode=0o700)
    assert (job_dir / "workspace" / "v").is_symlink()  # more than prepare() takes
    ran.unlink()

    d.start()
    assert client.wait_sweep("cut", timeout=DEADLINE)["phase"] == "Succeeded"
    attempts = [(a["number"], a["phase"]) for a in client.attempts("cut-1")]
    if left == "its attempt directory":
        assert attempts == [(1, "NotStarted"), (2, "Exited")], attempts
        assert (attempt / shim.ABANDONED).exists()  # a shim let go late runs nothing
        assert ran.read_text() == "2\n"
    else:
        assert attempts == [(1, "Exited")], attempts
        assert ran.read_text() == "1\n"
    assert client.get_job("cut-1")["retries_used"] == 0
    health = client.transport.request("GET", "/v1/health")
    assert not health.get("problems"), health
    assert " ERROR " not in d.log()


def test_a_retry_prepared_but_never_started_before_a_kill_gets_a_directory_of_its_own(
        tmp_path: Path, one_cpu: testing.Daemon) -> None:
    """The same for a later attempt: a retry's directory made, its start not committed
    when the daemon was killed. It is spent as not started (no retry spent), and the job
    runs again as the next attempt. The database is saved in the second retry's pause,
    two seconds long (the first lasts one)."""
    d, client = one_cpu, one_cpu.client()
    count = tmp_path / "count"
    saved = tmp_path / "saved.db"
    client.create_sweep({
        "name": "again", "canary": "none", "template": {"cpu": 1, "retries": 2},
        "map": {"args": ["sh", "-c", f'n=$(($(cat {count} 2>/dev/null || echo 0) + 1)); '
                         f'echo $n > {count}; [ $n -ge 3 ] || exit 3', ":::", "x"]}})
    testing.wait_until(lambda: (lambda j: (j["reason"], j["attempts"]))(
        client.get_job("again-0")) == ("Retrying", 2), "the second attempt to fail")
    save_database(d, saved)
    with contextlib.closing(sqlite3.connect(saved)) as conn:
        assert conn.execute("SELECT phase, attempts FROM jobs WHERE name = 'again-0'"
                            ).fetchone() == ("Pending", 2)  # saved in the pause
    assert client.wait_sweep("again", timeout=DEADLINE)["phase"] == "Succeeded"
    put_back_database(d, saved)
    attempt = d.data_dir / "jobs" / str(job_id_of(saved, "again-0")) / "attempt-3"
    shutil.rmtree(attempt)
    attempt.mkdir(mode=0o700)  # made, and no start recorded in it

    d.start()
    assert client.wait_sweep("again", timeout=DEADLINE)["phase"] == "Succeeded"
    job = client.get_job("again-0")
    assert (job["phase"], job["retries_used"]) == ("Succeeded", 2), job
    attempts = [(a["number"], a["phase"], a["exit_code"])
                for a in client.attempts("again-0")]
    assert attempts == [(1, "Exited", 3), (2, "Exited", 3), (3, "NotStarted", None),
                        (4, "Exited", 0)], attempts
    assert count.read_text() == "4\n"  # 3 ran before the database was put back
    assert " ERROR " not in d.log()


def test_a_shim_let_go_just_before_a_restart_finds_its_rank_cgroups(
        tmp_path: Path, binary: Path) -> None:
    """A daemon let an armed shim go and died before the shim took its lock. The next
    daemon's runtime, starting, swept the rank cgroups that held no process: the shim's
    job then could not enter its own and failed 126 without running. Real cgroups; the
    late shim is one still held when the next runtime starts, let go after."""
    if os.geteuid() != 0:
        pytest.skip("cgroups are the root daemon's")
    layout = JobLayout(tmp_path / "data")
    parent = f"noduslocal-test-late-{os.getpid()}"
    name = cgroup_name(7, 1, 0)

    async def body() -> Exited:
        old = HostRuntime(layout, Spawner(binary), Cgroups.detect(parent))
        if not old.cgroups.enabled:
            pytest.fail(f"no cgroups here: {old.cgroups.describe()}")
        await old.spawner.start()
        new = HostRuntime(layout, Spawner(binary), Cgroups.detect(parent))
        try:
            launch = launch_of(layout, job(7))
            assert old.arm(launch)
            await testing.eventually(lambda: old.armed(7, 1), "the arming")
            held = await old._armed[(7, 1)]
            assert held is not None
            pid = held.pid
            assert old.marks.put(launch.ref.directory, held.mark)  # the dead daemon's go
            made = [path for path in old.cgroups.paths(name) if path.exists()]
            assert made, "no rank cgroup was made"
            await new.start()  # the restarted daemon's runtime, the old shim not yet at its lock
            assert all(path.exists() for path in made), "the late shim's cgroups were removed"
            # Left as it was: a made-ahead first attempt is taken as it is only while empty.
            assert list(launch.ref.directory.iterdir()) == []
            pidfd = os.pidfd_open(pid)
            watched = old.spawner.watch(launch.ref.directory, pid, pidfd)
            signal.pidfd_send_signal(pidfd, signal.SIGUSR1)  # the dead daemon's go
            state = await asyncio.wait_for(watched, DEADLINE)
            assert isinstance(state, Exited)
            return state
        finally:
            try:
                await new.close()
            finally:
                try:
                    await old.close()
                finally:
                    await asyncio.to_thread(old.cgroups.remove_all)

    state = asyncio.run(body())
    assert (state.exit_code, (layout.attempt_dir(7, 1) / shim.OUTPUT_LOG).read_text()) == (
        0, "1\n"), (layout.attempt_dir(7, 1) / shim.OUTPUT_LOG).read_text()


def test_a_kill_while_a_cell_is_armed_costs_it_no_attempt_and_is_no_damage(
        tmp_path: Path, one_cpu: testing.Daemon) -> None:
    """A sweep's next cell is armed (its rank cgroup made, its shim held) and made ahead
    (its empty first attempt) when the daemon is killed -9. The next daemon keeps that
    cgroup while the cell may still start, and its look at the directory must leave it
    empty: a lock file made there read as a start (a false "damaged database" ERROR), and
    the cell spent attempt 1 as NotStarted."""
    d, client = one_cpu, one_cpu.client()
    release = tmp_path / "release"
    client.create_sweep({
        "name": "armed", "canary": "none", "max_parallel": 1,
        "template": {"cpu": 1, "command": [
            "sh", "-c", f'if [ "$X" = 0 ]; then while [ ! -e {release} ]; do sleep 0.05; '
            'done; fi']},
        "grid": {"X": ["0", "1", "2"]}})
    testing.wait_until(lambda: client.get_job("armed-0")["phase"] == "Running",
                       "the first cell to run")
    db = d.data_dir / "noduslocal.db"
    nxt = job_id_of(db, "armed-1")
    made_ahead = d.data_dir / "jobs" / str(nxt) / "attempt-1"
    rank = f"*/{parent_name(d.data_dir, SYSTEM_DATA_DIR)}/{cgroup_name(nxt, 1, 0)}"
    testing.wait_until(lambda: made_ahead.is_dir() and any(ROOT.glob(rank)),
                       "the next cell to be made ahead and armed")
    d.restart()  # kill -9, then a start
    assert list(made_ahead.iterdir()) == []
    release.touch()
    testing.wait_until(lambda: client.get_sweep("armed")["phase"] == "Succeeded",
                       "the sweep to succeed", timeout=60)
    for cell in ("armed-0", "armed-1", "armed-2"):
        assert [a["phase"] for a in client.attempts(cell)] == ["Exited"], cell
    health = client.transport.request("GET", "/v1/health")
    assert not health.get("problems"), health
    assert " ERROR " not in d.log()


def test_a_shim_let_go_just_before_a_kill_and_late_to_its_lock_runs_nothing(
        tmp_path: Path, binary: Path) -> None:
    """The last daemon let an armed shim go (its go mark put on the made-ahead first
    attempt, its signal sent) and was killed before its start's commit; the shim had not
    taken its lock when the next daemon's recovery took that directory as it is (the job
    pending, the attempt unspent). The shim, going on after that, must run nothing: the
    next daemon starts the attempt itself, and the job runs once, not twice. Real
    spawners, shims and recovery; the late shim is one let go after the recovery."""
    layout = JobLayout(tmp_path / "data", overlay=False)
    layout.jobs_dir.mkdir(parents=True)
    ran = tmp_path / "ran"
    record = replace(job(7), spec=JobSpec(command=["sh", "-c", f"echo x >> {ran}"]))
    layout.prepare_ahead(record)  # what a sweep's next cell has before its start

    async def body() -> tuple[list[str], Exited]:
        old = HostRuntime(layout, Spawner(binary))
        await old.spawner.start()
        new = HostRuntime(layout, Spawner(binary))
        try:
            launch = launch_of(layout, record)
            assert old.arm(launch)
            await testing.eventually(lambda: old.armed(7, 1), "the arming")
            held = await old._forget((7, 1))  # type: ignore[misc]
            assert held is not None
            assert old.marks.put(launch.ref.directory, held.mark)  # the go, up to its signal
            await new.start()
            assert await asyncio.to_thread(lost_starts, layout, record) == (None, [])
            os.kill(held.pid, signal.SIGUSR1)  # the go reaches the shim only now
            await asyncio.to_thread(wait_for, lambda: gone(held.pid), "the late shim's exit")
            late = sorted(p.name for p in launch.ref.directory.iterdir())
            [rank] = await new.launch(launch)  # the next daemon's start, in that directory
            state = await asyncio.wait_for(rank.ended, DEADLINE)
            assert isinstance(state, Exited)
            return late, state
        finally:
            try:
                await new.close()
            finally:
                await old.close()

    late, state = asyncio.run(body())
    assert late == []  # it took the lock and left: no record, no log, nothing marked
    assert (state.exit_code, ran.read_text()) == (0, "x\n")


@pytest.mark.parametrize("kind", ["compiled", "python"])
def test_a_shim_runs_only_under_the_go_mark_its_request_names(
        tmp_path: Path, binary: Path, kind: str) -> None:
    """Both shims: a directory whose mark is another's (a restarted daemon's start), or
    that bears none (a recovery took it off), runs nothing; the named mark runs the job."""
    ran = tmp_path / "ran"

    async def launch(directory: Path, mark: bytes | None) -> None:
        directory.mkdir()
        if mark is not None:
            os.setxattr(directory, shim.GO_MARK, mark)
        spawner = Spawner(binary if kind == "compiled" else None)
        await spawner.start()
        try:
            request = held_request(directory, ["sh", "-c", f"echo {directory.name} >> {ran}"],
                                   hold=0)
            request["mark"] = "ours-1"
            pid = await spawner.launch(request)
            await asyncio.to_thread(wait_for, lambda: gone(pid), "the shim's exit")
        finally:
            await spawner.close()

    for name, mark in (("another", b"ours-2"), ("none", None), ("ours", b"ours-1")):
        asyncio.run(launch(tmp_path / name, mark))
        assert (read_pid(tmp_path / name) is not None) == (name == "ours"), name
    assert ran.read_text() == "ours\n"


def test_a_shim_stuck_at_the_lock_of_a_made_ahead_attempt_is_killed_not_run_beside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A shim past its mark check holds the made-ahead attempt's lock but has reserved no
    records when the next daemon looks (stalled: a slow disk, a loaded box). Waiting for it
    forever would stop the daemon's start; taking the directory while it lives would run
    the job twice (review of ad5a435: after 5 s the look gave up and took it, the mark
    still on). It is killed (it has run nothing yet), and the attempt is started once."""
    monkeypatch.setattr(orphans, "FENCE_WAIT", 0.5)
    layout = JobLayout(tmp_path / "data", overlay=False)
    layout.jobs_dir.mkdir(parents=True)
    record = job(7)
    layout.prepare_ahead(record)
    directory = layout.attempt_dir(7, 1)
    os.setxattr(directory, shim.GO_MARK, b"the-last-daemon-1")
    holder = subprocess.Popen(  # the stalled shim: its lock taken, nothing reserved
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
         str(directory)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with caplog.at_level(logging.WARNING, "noduslocal.daemon.jobs.orphans"):
            assert lost_starts(layout, record) == (None, [])
        assert holder.wait(DEADLINE) == -signal.SIGKILL
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(OSError):
        os.getxattr(directory, shim.GO_MARK)
    assert list(directory.iterdir()) == []
    assert f"killed [{holder.pid}] so that the attempt runs once" in caplog.text
