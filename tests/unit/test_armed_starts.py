"""The lifecycle's side of armed launches (issue 25, part 5): a sweep's next cells armed
after each launch, each let go as its start is queued and before that start commits, the
end never waiting for that commit; a start that fails to commit stops the attempt and fails
its job. A fake runtime that can arm stands for the host's (its shims: system tests)."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from noduslocal import testing
from noduslocal.daemon.runtime.base import ArmingRuntime, Launch, Rank
from noduslocal.daemon.store import job_writes


class ArmingFake(testing.FakeRuntime):
    """Arms what it is asked to; a launch of an armed attempt is its `go`, which notes the
    job's committed phase (read from the database file) at that moment."""

    def __init__(self) -> None:
        super().__init__()
        self.db: Path | None = None
        self.armed_keys: set[tuple[int, int]] = set()
        self.goes: list[tuple[int, str]] = []  # (job id, its committed phase then)

    def arm(self, launch: Launch) -> bool:
        self.armed_keys.add((launch.ref.job.id, launch.ref.number))
        return True

    def armed(self, job_id: int, number: int) -> bool:
        return (job_id, number) in self.armed_keys

    def holds(self, job_id: int, number: int) -> bool:
        return self.armed(job_id, number)

    async def launch(self, launch: Launch) -> list[Rank]:
        key = (launch.ref.job.id, launch.ref.number)
        if key in self.armed_keys:
            self.armed_keys.discard(key)
            assert self.db is not None
            with sqlite3.connect(self.db) as conn:
                [(phase,)] = conn.execute("SELECT phase FROM jobs WHERE id = ?", (key[0],))
            self.goes.append((key[0], phase))
        return await super().launch(launch)


def test_the_fake_is_an_arming_runtime() -> None:
    assert isinstance(ArmingFake(), ArmingRuntime)
    assert not isinstance(testing.FakeRuntime(), ArmingRuntime)


async def run_sweep(tmp_path: Path, runtime: ArmingFake, cells: int) -> list[Any]:
    async with testing.lifecycle(tmp_path, runtime, cpus=2) as h:
        runtime.db = h.settings.data_dir / "noduslocal.db"
        sweep = await h.create_sweep("s", canary="none", max_parallel=2,
                                     grid={"X": [str(i) for i in range(cells)]},
                                     template={"command": ["train"], "cpu": 1})
        ids = [job.id for job in await h.cells(sweep)]
        for job_id in ids:
            [rank] = await h.launched(job_id)
            rank.exit(0)
        return [await h.ended(job_id) for job_id in ids]


def test_a_sweeps_next_cells_are_let_go_before_their_start_commits(tmp_path: Path) -> None:
    runtime = ArmingFake()
    ended = asyncio.run(run_sweep(tmp_path, runtime, 8))
    assert [(job.phase, job.attempts) for job in ended] == [("Succeeded", 1)] * 8
    # The first two are launched as usual; the rest were armed after a launch before them.
    assert len(runtime.goes) >= 4, runtime.goes
    assert {phase for _, phase in runtime.goes} == {"Pending"}  # not committed yet


def test_an_armed_start_that_fails_to_commit_stops_the_attempt_and_fails_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    runtime = ArmingFake()
    real = job_writes.start_attempt
    refused: list[int] = []

    def start_attempt(conn: sqlite3.Connection, job_id: int, *args: Any,
                      **kwargs: Any) -> Any:
        if not refused and any(job_id == gone for gone, _ in runtime.goes):
            refused.append(job_id)  # the first armed one, let go already
        if job_id in refused:  # each try of its start (the batch's, then its own)
            raise sqlite3.OperationalError("disk I/O error")
        return real(conn, job_id, *args, **kwargs)

    monkeypatch.setattr(job_writes, "start_attempt", start_attempt)

    async def body() -> None:
        async with testing.lifecycle(tmp_path, runtime, cpus=2) as h:
            runtime.db = h.settings.data_dir / "noduslocal.db"
            sweep = await h.create_sweep("s", canary="none", max_parallel=2,
                                         grid={"X": [str(i) for i in range(6)]},
                                         template={"command": ["train"], "cpu": 1})
            ids = [job.id for job in await h.cells(sweep)]
            for job_id in ids:
                [rank] = await h.launched(job_id)
                if job_id not in refused:
                    rank.exit(0)
            [job_id] = refused
            failed = await h.ended(job_id)
            assert (failed.phase, failed.reason) == ("Failed", "StartFailed"), failed
            assert "could not record its start" in (failed.message or "")
            assert failed.attempts == 0  # no attempt of it is recorded
            [rank] = runtime.of(job_id)
            assert rank.signals == [9]  # killed: it ran unrecorded
            others = [await h.ended(i) for i in ids if i != job_id]
            assert {job.phase for job in others} == {"Succeeded"}

    with caplog.at_level("ERROR", logger="asyncio"):
        asyncio.run(body())
        gc.collect()  # the end's write failed too: unread, asyncio said so when collected
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
