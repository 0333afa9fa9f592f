"""Running an indexed job's attempt: indexes 0..N-1, at most `parallelism` at once, each
in a share of the job's GPUs (a slot); the first that fails stops the rest and ends the
attempt; indexes that succeeded in an earlier attempt are not run again; after a restart
the running ones are adopted and the rest go on. Each index's outputs are collected as it
ends. The attempt directory's `indexes.json` says which index started in which slot and
how each ended. A runtime whose scheduler runs indexes itself (a Slurm job array) gets them
all in one launch, and its ranks' ends are recorded the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.jobs.attempt import Attempt, AttemptLife
from noduslocal.daemon.jobs.stops import Stopper
from noduslocal.daemon.runtime.base import (
    ArrayRuntime,
    AttemptState,
    Exited,
    Launch,
    LaunchFailed,
    NeverStarted,
    NotLaunched,
    Rank,
    Runtime,
    Vanished,
    failed,
    rank_dir,
)
from noduslocal.daemon.store import Store, job_writes
from noduslocal.domain.jobs import Collected, JobRecord

log = logging.getLogger(__name__)
JOURNAL = "indexes.json"


def _load(directory: Path) -> dict[str, Any]:
    with contextlib.suppress(FileNotFoundError, ValueError):
        data = json.loads((directory / JOURNAL).read_text())
        if isinstance(data, dict):
            return {**{key: {int(k): v for k, v in data.get(key, {}).items()}
                       for key in ("slots", "ends", "dirs")},
                    "failed": list(data.get("failed", []))}
    return {"slots": {}, "ends": {}, "dirs": {}, "failed": []}


def index_dir(directory: Path, index: int) -> Path:
    """Where index `index` of the attempt in `directory` runs (or last ran)."""
    name = _load(directory)["dirs"].get(index)
    return directory / name if name else rank_dir(directory, index, indexed=True)


def attempt_of_index(layout: JobLayout, job: JobRecord, index: int) -> int:
    """The last attempt that ran index `index` (a retry skips the ones that succeeded)."""
    return attempts_of_indexes(layout, job).get(index, job.attempts)


def attempts_of_indexes(layout: JobLayout, job: JobRecord) -> dict[int, int]:
    """Each index that ran, and the last attempt that ran it (one journal read an
    attempt)."""
    found: dict[int, int] = {}
    for number in range(1, job.attempts + 1):
        found.update(dict.fromkeys(_load(layout.attempt_dir(job.id, number))["slots"], number))
    return dict(sorted(found.items()))


def succeeded(layout: JobLayout, job: JobRecord, before: int) -> set[int]:
    """Indexes that exited 0 in attempts before `before`: a retry does not run them."""
    done: set[int] = set()
    for number in range(1, before):
        ends = _load(layout.attempt_dir(job.id, number))["ends"]
        done |= {index for index, code in ends.items() if code == 0}
    return done


def index_launch(launch: Launch, index: int, slot: int) -> Launch:
    """One index's launch: its env, and its slot's share of the job's GPUs."""
    indexed, gpu = launch.ref.job.spec.indexed, launch.ref.job.spec.gpu
    assert indexed is not None
    per_slot = gpu.count // indexed.parallelism if gpu else 0
    return replace(launch, index=index, gpus=launch.gpus.part(slot, per_slot))


def running_index_launch(launch: Launch, index: int) -> Launch:
    """The launch a running index had (for an exec beside it), from its slot's record."""
    return index_launch(launch, index, _load(launch.ref.directory)["slots"].get(index, 0))


class IndexedRun:
    def __init__(self, store: Store, layout: JobLayout, stopper: Stopper,
                 runtimes: Mapping[str, Runtime],
                 collect: Callable[[JobRecord, int], Awaitable[list[Collected]]]) -> None:
        """`collect(job, index)`: that index's outputs, copied into the store."""
        self.store = store
        self.layout = layout
        self.stopper = stopper
        self.runtimes = runtimes
        self.collect = collect

    async def run(self, attempt: Attempt, launch: Launch, adopting: bool = False) -> AttemptState:
        """Drive the attempt until every index it runs ended; its end for the runner."""
        job, directory = attempt.job, attempt.ref.directory
        indexed = job.spec.indexed
        assert indexed is not None
        runtime = self.runtimes[job.spec.runtime]
        journal = _load(directory)
        attempt.rank_dirs.update(journal["dirs"])
        done = succeeded(self.layout, job, attempt.number) | {
            i for i, code in journal["ends"].items() if code == 0}
        running: dict[asyncio.Future[AttemptState], tuple[int, int]] = {}
        decider: AttemptState | None = None
        again: list[int] = []  # indexes whose start a dead daemon began: run again
        if adopting:
            recorded, attempt.handles = attempt.handles, []
            for index, slot in journal["slots"].items():
                if index in journal["ends"]:
                    continue
                found = await runtime.adopt(index_launch(launch, index, slot), recorded,
                                            recorded_running=attempt.launched,
                                            stopping=attempt.stop_reason is not None)
                if isinstance(found, list):
                    self._take(attempt, found[0], running, index, slot)
                elif isinstance(found, NeverStarted):
                    again.append(index)
                else:  # ended while the daemon was away: recorded like any end
                    verdict = await self._ended(attempt, journal, index, found)
                    decider = decider or verdict
                    if not failed(found):
                        done.add(index)
            if running and not attempt.launched:  # it died between a launch and its commit
                await self._running(attempt, time.time())
        todo = sorted([i for i in range(indexed.completions)
                       if i not in done and i not in journal["slots"]] + again, reverse=True)
        busy = {slot for _, slot in running.values()}
        slots = [s for s in range(indexed.parallelism - 1, -1, -1) if s not in busy]
        if decider is not None and running:
            await self.stopper.stop_ranks(attempt)
        while True:
            while (decider is None and todo and slots and attempt.stop_reason is None
                   and attempt.lost is None):
                index, slot = todo.pop(), slots.pop()
                journal["slots"][index] = slot
                self._fresh_dir(attempt, journal, index)
                self._save(directory, journal)
                try:
                    ranks = await runtime.launch(index_launch(launch, index, slot))
                except NotLaunched as exc:  # the runtime went away: the rest stops too
                    decider = exc.state
                    if running:
                        await self.stopper.stop_ranks(attempt)
                    break
                except LaunchFailed:
                    if running:
                        await self.stopper.stop_ranks(attempt)
                        await asyncio.wait(running)
                    raise
                self._take(attempt, ranks[0], running, index, slot)
                if not attempt.launched:
                    await self._running(attempt, ranks[0].started_at)
            if not running:
                break
            ended, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for end in ended:
                index, slot = running.pop(end)
                state = end.result()
                verdict = await self._ended(attempt, journal, index, state)
                if verdict is not None and decider is None:
                    decider = verdict
                    if running:
                        await self.stopper.stop_ranks(attempt)
                slots.append(slot)
        if decider is not None:
            return decider
        if todo and attempt.life is AttemptLife.STOP_ASKED:
            attempt.stop_landed()  # stopped (cancel, suspend) between indexes: as asked
        now = time.time()
        return Exited(143 if todo else 0, None, now, now)

    # --- as one array of the runtime's own ----------------------------------------------

    def array_runtime(self, job: JobRecord) -> ArrayRuntime | None:
        """The job's runtime when it runs an indexed job's indexes itself, else None."""
        runtime = self.runtimes[job.spec.runtime]
        return runtime if isinstance(runtime, ArrayRuntime) else None

    async def submit(self, attempt: Attempt, launch: Launch) -> list[Rank]:
        """Every index not yet succeeded (in an earlier attempt) as one array, recorded in
        the journal as started first (a restart then looks for the array)."""
        runtime = self.array_runtime(attempt.job)
        assert runtime is not None and attempt.job.spec.indexed is not None
        directory = attempt.ref.directory
        journal = _load(directory)
        done = succeeded(self.layout, attempt.job, attempt.number)
        indexes = [i for i in range(attempt.job.spec.indexed.completions) if i not in done]
        for index in indexes:
            journal["slots"][index] = 0
            journal["dirs"][index] = runtime.index_place(directory, index)
        self._save(directory, journal)
        return await runtime.launch_array(launch, indexes)

    async def adopt(self, attempt: Attempt, launch: Launch) -> list[Rank] | AttemptState:
        """After a restart: the array's indexes whose end the journal lacks, watched again,
        or what became of the array (never submitted)."""
        runtime = self.array_runtime(attempt.job)
        assert runtime is not None
        journal = _load(attempt.ref.directory)
        left = sorted(i for i in journal["slots"] if i not in journal["ends"])
        if not left:
            return []
        return await runtime.adopt_array(launch, left, attempt.handles,
                                         stopping=attempt.stop_reason is not None)

    async def follow(self, attempt: Attempt, ranks: list[Rank]) -> AttemptState:
        """Until every index of the array ended: each end recorded and its outputs
        collected as it comes; the first failure stops the rest and is the attempt's end.
        An index that never started because of that (or of a stop) did not run: it is
        left to the next attempt."""
        directory = attempt.ref.directory
        journal = _load(directory)
        decider: AttemptState | None = None
        if journal["failed"]:  # decided before a restart
            code = journal["ends"].get(journal["failed"][0])
            now = time.time()
            decider = Exited(code, None, now, now) if isinstance(code, int) else \
                Vanished("an index was lost before the daemon restarted")
        running = {rank.ended: rank.handle.rank for rank in ranks}
        unrun = 0
        while running:
            ended, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for end in ended:
                index, state = running.pop(end), end.result()
                if isinstance(state, NeverStarted) and (
                        decider is not None or attempt.stop_reason is not None):
                    journal["slots"].pop(index, None)
                    journal["dirs"].pop(index, None)
                    self._save(directory, journal)
                    unrun += 1
                    continue
                verdict = await self._ended(attempt, journal, index, state)
                if verdict is not None and decider is None:
                    decider = verdict
                    if running:
                        await self.stopper.stop_ranks(attempt)
        if decider is not None:
            return decider
        if unrun and attempt.life is AttemptLife.STOP_ASKED:
            attempt.stop_landed()  # stopped (cancel, suspend) before these started: as asked
        now = time.time()
        return Exited(143 if unrun else 0, None, now, now)

    @staticmethod
    def _fresh_dir(attempt: Attempt, journal: dict[str, Any], index: int) -> None:
        """The index's directory: a new name when one of its earlier start is there (marked
        abandoned after a restart, so a late shim of the dead daemon never runs twice)."""
        name, again = f"index-{index}", 0
        while (attempt.ref.directory / name).exists():
            again += 1
            name = f"index-{index}.{again}"
        journal["dirs"][index] = name
        attempt.rank_dirs[index] = name

    async def _running(self, attempt: Attempt, at: float) -> None:
        attempt.mark_launched()
        await self.store.write(lambda c: job_writes.attempt_running(
            c, attempt.job.id, attempt.number, at, attempt.handles))

    def _take(self, attempt: Attempt, rank: Rank, running: dict[Any, tuple[int, int]],
              index: int, slot: int) -> None:
        attempt.handles.append(rank.handle)
        attempt.ends.append(rank.ended)
        running[rank.ended] = (index, slot)

    async def _ended(self, attempt: Attempt, journal: dict[str, Any], index: int,
                     state: AttemptState) -> AttemptState | None:
        """Record one index's end and collect its outputs; the state if it ends the
        attempt."""
        code = state.exit_code if isinstance(state, Exited) else "lost"
        journal["ends"][index] = code
        decides = failed(state) and not journal["failed"] and attempt.stop_reason is None
        if decides:  # the ones it stops end too, but did not fail on their own
            journal["failed"] = [index]
        self._save(attempt.ref.directory, journal)
        if isinstance(state, Exited) and attempt.job.spec.outputs:
            collected = await self.collect(attempt.job, index)
            job_id, number = attempt.job.id, attempt.number
            await self.layout.blobs.recorded(self.store.write(
                lambda c: job_writes.record_outputs(c, job_id, number, collected, time.time())),
                [out.sha256 for out in collected])
        return state if failed(state) else None

    @staticmethod
    def _save(directory: Path, journal: dict[str, Any]) -> None:
        tmp = directory / f".{JOURNAL}.tmp"
        tmp.write_text(json.dumps(journal))
        os.replace(tmp, directory / JOURNAL)


def index_view(layout: JobLayout, job: JobRecord, attempt: Attempt | None) -> dict[str, Any]:
    """What `job status` shows of an indexed job: how many indexes succeeded (in any
    attempt), which run now, which failed in its last attempt."""
    assert job.spec.indexed is not None
    done = succeeded(layout, job, job.attempts + 1)
    last = _load(layout.attempt_dir(job.id, job.attempts)) if job.attempts else {"failed": []}
    running = sorted(h.rank for h, end in zip(attempt.handles, attempt.ends, strict=True)
                     if not end.done()) if attempt is not None else []
    return {"completions": job.spec.indexed.completions,
            "parallelism": job.spec.indexed.parallelism, "succeeded": len(done),
            "running": running, "failed": last["failed"]}
