"""The lifecycle drives any runtime through runtime.base.Runtime alone: a minimal runtime
written here (the interface is what is under test) runs an attempt, is stopped, and has its
rank adopted by a second lifecycle on the same database, as a Slurm backend would be."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from noduslocal.daemon.build import build_daemon
from noduslocal.daemon.config.settings import load_settings
from noduslocal.daemon.coordinator import Lifecycle
from noduslocal.daemon.gpus.model import Inventory
from noduslocal.daemon.runtime.base import (
    LOG_FILES,
    AttemptRef,
    AttemptState,
    ExecResult,
    Exited,
    Launch,
    Rank,
    Runtime,
    Vanished,
)
from noduslocal.daemon.store import Store, job_writes
from noduslocal.domain.jobs import Diagnosis, Handle
from noduslocal.domain.states import TERMINAL
from noduslocal.domain.validation import parse_create


class ListRuntime:
    """Ranks that are futures the test ends by hand; every call is written down."""

    kind = "process"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.ends: dict[str, asyncio.Future[AttemptState]] = {}
        self.alive: set[str] = set()  # refs that adopt() finds running
        self._next = 100

    async def diagnose(self, gpus: bool) -> list[Diagnosis]:
        return [Diagnosis("list", gpus, f"{len(self.calls)} calls")]

    def wait_reason(self) -> str | None:
        return None

    def _rank(self, ref: str, started_at: float) -> Rank:
        end = self.ends.setdefault(ref, asyncio.get_running_loop().create_future())
        return Rank(Handle(self.kind, ref, 0, "test-boot"), started_at, end)

    async def launch(self, launch: Launch) -> list[Rank]:
        self._next += 1
        ref = f"r{self._next}"
        self.calls.append(("launch", (launch.ref.job.name, launch.ref.number, launch.secrets,
                                      launch.gpus.uuids)))
        (launch.ref.directory / LOG_FILES["all"]).write_text(f"rank {ref}\n")
        self.alive.add(ref)
        return [self._rank(ref, time.time())]

    async def adopt(self, launch: Launch, recorded: list[Handle], recorded_running: bool,
                    stopping: bool) -> list[Rank] | AttemptState:
        self.calls.append(("adopt", ([h.ref for h in recorded], recorded_running, stopping)))
        ranks = [self._rank(h.ref, time.time()) for h in recorded if h.ref in self.alive]
        return ranks or Vanished("the test removed it")

    async def signal(self, ref: AttemptRef, handle: Handle, sig: int) -> bool:
        self.calls.append(("signal", (handle.ref, sig)))
        end = self.ends.get(handle.ref)
        if end is None or end.done():
            return False
        end.set_result(Exited(128 + sig, sig, 0.0, time.time()))
        return True

    async def clear_lost(self, ref: AttemptRef, handles: list[Handle]) -> None:
        self.calls.append(("clear_lost", [h.ref for h in handles]))

    async def release(self, ref: AttemptRef, handles: list[Handle]) -> None:
        self.calls.append(("release", [h.ref for h in handles]))

    async def exec(self, launch: Launch, handle: Handle, command: list[str],
                   timeout: float) -> ExecResult:
        self.calls.append(("exec", (handle.ref, command)))
        return ExecResult(0, " ".join(command), "", False)

    def log_path(self, directory: Path, stream: str, rank: int = 0) -> Path:
        return directory / LOG_FILES[stream]


def run_with(tmp_path: Path, runtime: ListRuntime,
             body: Callable[[Lifecycle, Store], Awaitable[None]]) -> None:
    settings = load_settings(None, socket=tmp_path / "s", data_dir=tmp_path / "data",
                             overrides={"cpus": "2", "memory": "1GiB"})

    async def main() -> None:
        settings.data_dir.mkdir(exist_ok=True)  # the daemon makes it before it builds
        conforming: Runtime = runtime  # the type checker holds it to the protocol
        daemon = await build_daemon(settings, runtimes=[conforming],
                                    inventory=Inventory([], "none", "no GPUs"))
        try:
            await daemon.start()
            await body(daemon.lifecycle, daemon.store)
        finally:
            await daemon.stop()
            await daemon.close()

    asyncio.run(main())


async def settled(store: Store, job_id: int, phase: str | None = None) -> Any:
    for _ in range(500):
        job = await store.job_by_id(job_id)
        assert job is not None
        if (phase is None and job.phase in TERMINAL) or job.phase == phase:
            return job
        await asyncio.sleep(0.01)
    raise AssertionError(f"job {job_id} stayed {job.phase if job else None}")


OWNER = job_writes.Owner(0, 0, "root", admin=True)


def create(lifecycle: Lifecycle, name: str) -> Awaitable[Any]:
    req = parse_create({"name": name, "command": ["train"]}, regions=("local",))
    return lifecycle.jobs.create(req, OWNER, None, None)


def test_an_attempt_runs_through_any_runtime_and_its_handle_is_recorded(
        tmp_path: Path) -> None:
    runtime = ListRuntime()

    async def body(lifecycle: Lifecycle, store: Store) -> None:
        job, _ = await create(lifecycle, "one")
        running = await settled(store, job.id, "Running")
        attempt = (await store.attempts(job.id))[-1]
        assert attempt.handles == [Handle("process", "r101", 0, "test-boot")]
        assert lifecycle.jobs.log_path(running, 1, "all").read_text() == "rank r101\n"
        result = await lifecycle.jobs.exec(running, ["echo", "hi"], 5)
        assert result.stdout == "echo hi"
        runtime.ends["r101"].set_result(Exited(0, None, 0.0, time.time()))
        done = await settled(store, job.id)
        assert (done.phase, done.exit_code) == ("Succeeded", 0)
        for _ in range(100):  # released once the end is committed
            if ("release", ["r101"]) in runtime.calls:
                break
            await asyncio.sleep(0.01)

    run_with(tmp_path, runtime, body)
    kinds = [kind for kind, _ in runtime.calls]
    assert kinds == ["launch", "exec", "release"], runtime.calls
    assert runtime.calls[0][1] == ("one", 1, {}, [])


def test_a_cancel_signals_every_rank_through_the_runtime(tmp_path: Path) -> None:
    runtime = ListRuntime()

    async def body(lifecycle: Lifecycle, store: Store) -> None:
        job, _ = await create(lifecycle, "stopped")
        running = await settled(store, job.id, "Running")
        await lifecycle.jobs.control(running, "cancel")
        done = await settled(store, job.id)
        assert (done.phase, done.reason, done.exit_code) == ("Cancelled", "Cancelled", 143)

    run_with(tmp_path, runtime, body)
    assert ("signal", ("r101", signal.SIGTERM)) in runtime.calls


def test_a_second_lifecycle_adopts_the_rank_the_first_launched(tmp_path: Path) -> None:
    runtime = ListRuntime()
    job_ids: list[int] = []

    async def first(lifecycle: Lifecycle, store: Store) -> None:
        job, _ = await create(lifecycle, "kept")
        job_ids.append(job.id)
        await settled(store, job.id, "Running")

    async def second(lifecycle: Lifecycle, store: Store) -> None:
        for _ in range(100):
            if any(kind == "adopt" for kind, _ in runtime.calls):
                break
            await asyncio.sleep(0.01)
        runtime.ends["r101"].set_result(Exited(3, None, 0.0, time.time()))
        done = await settled(store, job_ids[0])
        assert (done.phase, done.exit_code, done.attempts) == ("Failed", 3, 1)

    run_with(tmp_path, runtime, first)
    runtime.ends.clear()  # the first daemon's futures died with its loop
    run_with(tmp_path, runtime, second)
    assert ("adopt", (["r101"], True, False)) in runtime.calls
    assert [kind for kind, _ in runtime.calls].count("launch") == 1


def test_a_rank_gone_after_a_restart_is_lost_and_its_leftovers_cleared(
        tmp_path: Path) -> None:
    runtime = ListRuntime()

    async def first(lifecycle: Lifecycle, store: Store) -> None:
        job, _ = await create(lifecycle, "vanishing")
        await settled(store, job.id, "Running")

    async def second(lifecycle: Lifecycle, store: Store) -> None:
        job = await store.job(OWNER.name, "vanishing")
        assert job is not None
        done = await settled(store, job.id)
        assert (done.phase, done.reason) == ("Failed", "Lost")

    run_with(tmp_path, runtime, first)
    runtime.alive.clear()  # the machine lost it while no daemon watched
    runtime.ends.clear()
    run_with(tmp_path, runtime, second)
    assert ("clear_lost", ["r101"]) in runtime.calls
