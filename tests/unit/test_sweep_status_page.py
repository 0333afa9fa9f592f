"""Sweep status documents (sweeps/reports.py) on the lifecycle with the in-memory fake
runtime: a page of sweeps is built from the same queries whatever its size, each document
as the sweep's own status makes it; failures are clustered from the stderr line kept with
each attempt's end (exactly what the file gives), so no file is read, and an attempt that
ended before the line was kept has its file read as before."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from noduslocal.daemon.sweeps import reports
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.states import Phase, SweepPhase
from noduslocal.domain.sweeps import SweepRecord
from noduslocal.testing import LifecycleHarness, eventually, lifecycle

NOT_FOUND = "FileNotFoundError: /data/shard-{}.npz"
TOO_BIG = "ValueError: batch 17 too big"


def run(tmp_path: Path, body: Callable[[LifecycleHarness], Awaitable[None]]) -> None:
    async def main() -> None:
        # Room for every cell of every sweep at once: which run is the test's to say.
        async with lifecycle(tmp_path, cpus=256, memory=1024 * 2**30) as parts:
            await body(parts)

    asyncio.run(main())


def stderr_of(h: LifecycleHarness, job: JobRecord, number: int = 1) -> Path:
    return h.lifecycle.jobs.log_path(job, number, "stderr")


async def end(h: LifecycleHarness, job: JobRecord, code: int, stderr: bytes | None = None,
              throughput: float | None = None) -> None:
    """Once the job runs: it writes `stderr` (and reports a throughput), then exits
    `code`; returns once its end is recorded."""
    (rank,) = await h.launched(job.id)
    if stderr is not None:
        stderr_of(h, job, rank.number).write_bytes(stderr)
    if throughput is not None:
        (h.layout.workspace(job.id) / ".nodus-metrics.jsonl").write_text(
            json.dumps({"throughput": throughput}) + "\n")
    rank.exit(code)
    await h.ended(job.id)


async def in_phase(h: LifecycleHarness, sweep: SweepRecord, phase: SweepPhase) -> None:
    async def look() -> bool:
        return (await h.sweep(sweep)).phase == phase

    await eventually(look, f"sweep {sweep.name} to be {phase}")


async def failing(h: LifecycleHarness, name: str) -> SweepRecord:
    """Ended Failed: cells 1 and 4 miss a shard (one cause), 0 runs out of something else,
    5 fails saying nothing on stderr; 2 and 3 succeed (3 the faster)."""
    sweep = await h.create_sweep(name, grid={"X": list(range(6))}, canary="none",
                                 max_parallel=6)
    cells = await h.cells(sweep)
    await end(h, cells[0], 1, f"{TOO_BIG}\n".encode())
    await end(h, cells[1], 2, f"loading\n{NOT_FOUND.format(1)}\n\n".encode())
    await end(h, cells[2], 0, throughput=10.0)
    await end(h, cells[3], 0, throughput=20.0)
    await end(h, cells[4], 2, f"{NOT_FOUND.format(4)}\n".encode())
    await end(h, cells[5], 3)
    await in_phase(h, sweep, SweepPhase.FAILED)
    return sweep


async def busy(h: LifecycleHarness, name: str, smoke: bool) -> SweepRecord:
    """Running past its canary (a smoke command's, or cell 0's), with a failed cell, a
    succeeded one and two still running."""
    gate: dict[str, Any] = {"canary_smoke": "true"} if smoke else {}
    sweep = await h.create_sweep(name, grid={"X": list(range(4))}, max_parallel=4, **gate)
    cells = await h.cells(sweep)
    if smoke:
        canary = await h.store.job(sweep.project, f"{name}-canary")
        assert canary is not None
        await end(h, canary, 0)
    await end(h, cells[0], 0, throughput=5.0)
    await end(h, cells[1], 1, f"RuntimeError: {name} diverged\n".encode())
    await h.launched(cells[2].id)
    await h.launched(cells[3].id)
    return sweep


async def page(h: LifecycleHarness) -> list[SweepRecord]:
    return await h.lifecycle.sweep_service.list(project=None, active_only=False, limit=100,
                                                before=None)


def wire(docs: Any) -> str:
    """The documents as the API writes them (so key order counts too)."""
    return json.dumps(docs)


def test_a_page_is_each_sweeps_own_status(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(h: LifecycleHarness) -> None:
        service = h.lifecycle.sweep_service
        await failing(h, "failing")
        gated = await h.create_sweep("gated", grid={"X": [1, 2, 3]})
        await h.launched((await h.cells(gated))[0].id)  # its canary runs
        smoked = await h.create_sweep("smoked", grid={"X": [1, 2]}, canary_smoke="true")
        canary = await h.store.job(smoked.project, "smoked-canary")
        assert canary is not None
        await h.launched(canary.id)
        await busy(h, "busy", smoke=False)
        running = await h.create_sweep("open", grid={"X": [1, 2]}, canary="none")
        for cell in await h.cells(running):
            await h.launched(cell.id)
        paused = await h.create_sweep("paused", grid={"X": [1, 2]}, canary="none")
        for cell in await h.cells(paused):
            await h.launched(cell.id)
        await service.control(paused, "suspend")
        await in_phase(h, paused, SweepPhase.SUSPENDED)
        # The sweep is Suspended at once, its running cells once their stops land: a page
        # read between the two would see a cell change phase between two documents.
        for cell in await h.cells(paused):
            await eventually(lambda c=cell: h.phase_of(c.id, Phase.SUSPENDED),
                             f"cell {cell.name} to be Suspended")

        sweeps = await page(h)
        assert [s.name for s in sweeps] == ["failing", "gated", "smoked", "busy", "open",
                                            "paused"]
        # One instant for every document: an estimate of running cells says when they
        # should end, from now.
        monkeypatch.setattr(reports, "time", SimpleNamespace(time=lambda: 1.9e9))
        for redact in (False, True):
            hidden = [redact] * len(sweeps)
            listed = await service.documents(sweeps, hidden)
            alone = [await service.document(s, redact) for s in sweeps]
            assert wire(listed) == wire(alone)
        mixed = [i % 2 == 0 for i in range(len(sweeps))]
        listed = await service.documents(sweeps, mixed)
        assert wire(listed) == wire([await service.document(s, r)
                                     for s, r in zip(sweeps, mixed, strict=True)])
        by_name = {d["name"]: d for d in listed}
        assert [(d["phase"], d["canary_job"]) for d in by_name.values()] == [
            ("Failed", None), ("Canary", "gated-0"), ("Canary", "smoked-canary"),
            ("Running", "busy-0"), ("Running", None), ("Suspended", None)]
        assert by_name["failing"]["failures"][0]["error"] == "***"  # redacted: not the owner's
        assert by_name["busy"]["failures"][0]["error"] == "RuntimeError: busy diverged"

    run(tmp_path, body)


def test_a_page_runs_the_same_queries_whatever_its_size(tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        for n in range(6):
            await busy(h, f"busy-{n}", smoke=n % 2 == 0)
        sweeps = await page(h)
        assert len(sweeps) == 6
        fetch = h.store.fetchall
        asked: list[str] = []

        async def counted(sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
            asked.append(sql)
            return await fetch(sql, params)

        h.store.fetchall = counted  # type: ignore[method-assign]
        counts = {}
        for size in (2, 6):
            asked.clear()
            docs = await h.lifecycle.sweep_service.documents(sweeps[:size], [False] * size)
            # Each has every part: clusters, a best cell, running cells, a canary.
            assert all(d["failures"] and d["best"] and d["canary_job"] for d in docs)
            assert all(d["counts"].get("Running") == 2 for d in docs)
            counts[size] = len(asked)
        assert counts[2] == counts[6] <= 7, counts

    run(tmp_path, body)


def test_failures_read_the_kept_line_and_only_older_ends_read_the_file(
        tmp_path: Path) -> None:
    async def body(h: LifecycleHarness) -> None:
        service = h.lifecycle.sweep_service
        sweep = await failing(h, "failing")
        failed = [job for job in await h.cells(sweep) if job.phase == "Failed"]

        async def documents() -> list[dict[str, Any]]:
            return await service.documents([sweep], [False])

        first = await documents()
        assert [(g["count"], g["exit_code"], g["error"], g["cells"], g["exemplar_error"])
                for g in first[0]["failures"]] == [
            (2, 2, "FileNotFoundError: PATH", [1, 4], NOT_FOUND.format(1)),
            (1, 1, "ValueError: batch N too big", [0], TOO_BIG),
            (1, 3, "exited with code 3", [5], "exited with code 3")]
        # The logs gone (or unreadable): the clusters are the same, from the database.
        for job in failed:
            if stderr_of(h, job).exists():
                stderr_of(h, job).rename(stderr_of(h, job).with_suffix(".gone"))
        assert wire(await documents()) == wire(first)
        assert wire(await service.document(sweep, False)) == wire(first[0])
        # Ends recorded before the line was kept: their files are read, as they were.
        with sqlite3.connect(h.store.path) as conn:
            conn.execute("UPDATE attempts SET stderr_line = NULL")
        assert wire(await documents()) != wire(first)  # the files are gone: no line
        for job in failed:
            gone = stderr_of(h, job).with_suffix(".gone")
            if gone.exists():
                gone.rename(stderr_of(h, job))
        assert wire(await documents()) == wire(first)

    run(tmp_path, body)


def test_the_line_kept_at_the_end_is_the_one_its_file_gives(tmp_path: Path) -> None:
    endings = {
        "blank-lines": b"first\nlast words\n\n   \n\n",
        "no-newline": b"one\ntwo",
        "long": b"x" * 3000 + b"\n" + b"y" * 5000,  # longer than the tail read
        "long-line-cut": b"start\n" + b"z" * (reports.TAIL + 100) + b"\n",
        "not-utf8": b"ok\n\xff\xfe broken \xc3\n",
        "crlf": b"a\r\nb\r\n",
        "empty": b"",
    }

    async def body(h: LifecycleHarness) -> None:
        jobs = {}
        for name, data in endings.items():
            jobs[name] = await h.create_job(name)
            await end(h, jobs[name], 1, data)
        jobs["no-log"] = await h.create_job("no-log")
        await end(h, jobs["no-log"], 1)  # wrote no stderr at all
        h.runtime.refused["refused"] = "no such image"  # given up as it was launched
        jobs["refused"] = await h.create_job("refused")
        await h.ended(jobs["refused"].id)
        fine = await h.create_job("fine")
        await end(h, fine, 0, b"a warning on the way\n")
        kept = {row[0]: row[1] for row in await h.store.fetchall(
            "SELECT j.name, a.stderr_line FROM attempts a JOIN jobs j ON j.id = a.job_id")}
        for name, job in jobs.items():
            assert kept[name] == reports.last_line(stderr_of(h, job)), name
        assert kept["blank-lines"] == "last words"
        assert kept["long"] == "y" * reports.TAIL  # the tail read, as the file gives
        assert kept["long-line-cut"] == "z" * (reports.TAIL - 1)
        assert kept["no-log"] == kept["refused"] == kept["empty"] == ""
        assert kept["fine"] is None  # a success is never clustered: nothing read

    run(tmp_path, body)
