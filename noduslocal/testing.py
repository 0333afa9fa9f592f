"""Start a real noduslocald in a temporary directory, for our tests and for yours.

    with noduslocal.testing.daemon(cpus=2) as d:
        job = nodus.Job.run(command=["true"])   # the SDK talks to this daemon
        job.wait()

The daemon is a separate process on a short socket path; `kill()` and `start()` again
test what a crash does. On exit every job process it started is killed and the directory
removed.

For unit tests of the lifecycle with no daemon and no processes: FakeRuntime, an in-memory
runtime whose ranks end when the test says, and lifecycle(), the daemon's parts built as
the daemon builds them (build.build_daemon) on a real SQLite store in a directory, driven
through that runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from noduslocal.daemon.runtime.base import (
    LOG_FILES,
    AttemptRef,
    AttemptState,
    ExecResult,
    Exited,
    Launch,
    LaunchFailed,
    NeverStarted,
    NotLaunched,
    Queued,
    Rank,
    Terminal,
    Vanished,
    rank_dir,
)
from noduslocal.daemon.runtime.shim import start_ticks
from noduslocal.domain import errors
from noduslocal.domain.jobs import Diagnosis, Handle
from noduslocal.domain.sockets import SOCKET_ENV
from noduslocal.sdk.api_client import ApiClient

if TYPE_CHECKING:
    from noduslocal.daemon.build import Daemon
    from noduslocal.daemon.config.settings import Settings
    from noduslocal.daemon.coordinator import Lifecycle
    from noduslocal.daemon.events import EventHub
    from noduslocal.daemon.files.layout import JobLayout
    from noduslocal.daemon.gpus.model import Inventory
    from noduslocal.daemon.store import Store
    from noduslocal.daemon.store.job_writes import Owner
    from noduslocal.domain.jobs import JobRecord
    from noduslocal.domain.sweeps import SweepRecord

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], what: str, timeout: float = 30.0) -> T:
    """Poll `predicate` until it returns something true and return that; fail with
    `what` in the message after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


def process_gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def pty_output(pid: int, fd: int) -> str:
    """All a child of `pty.fork()` wrote on its terminal, once it closed it (read returns
    nothing, or EIO as the last writer goes), the child then reaped."""
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    return out.decode(errors="replace")


class Daemon:
    def __init__(self, root: Path | None = None, *, cpus: float | str | None = None,
                 memory: str | None = None, config: str | None = None,
                 log_level: str = "INFO") -> None:
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="nl-", dir="/tmp"))
        os.chmod(self.root, 0o711)  # other local users may reach the socket, not list files
        self.socket = self.root / "api.sock"
        self.data_dir = self.root / "data"
        self.log_path = self.root / "daemon.log"
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = self.root / "config.toml"
            self.config_path.write_text(config)
        self.cpus = cpus
        self.memory = memory
        self.log_level = log_level
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "noduslocal.daemon.main", "--socket", str(self.socket),
                "--data-dir", str(self.data_dir), "--log-level", self.log_level]
        if self.cpus is not None:
            argv += ["--cpus", str(self.cpus)]
        if self.memory is not None:
            argv += ["--memory", str(self.memory)]
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        return argv

    def start(self, timeout: float = 15.0) -> Daemon:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"noduslocald exited with {self.proc.returncode}:\n"
                                   f"{self.log()}")
            try:
                client.transport.request("GET", "/v1/health", timeout=2)
                return self
            except errors.DaemonUnavailable:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"noduslocald did not answer within {timeout}s:\n"
                                       f"{self.log()}") from None
                time.sleep(0.02)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, as systemd would; returns the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        """kill -9: the crash the daemon must survive."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def restart(self) -> Daemon:
        self.kill()
        return self.start()

    def client(self) -> ApiClient:
        return ApiClient(self.socket)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def state_dump(self, timeout: float = 5.0) -> str:
        """The daemon's state and its loop's tasks, as `kill -USR1` makes it write them to
        its log (main.py's dump_state); "" when it does not within `timeout`."""
        if self.proc is None:
            return ""
        marker = "end of state dump"
        seen = self.log().count(marker)
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log()
            if text.count(marker) > seen:
                end = text.rindex(marker)
                return text[text.rindex("state dump (SIGUSR1)", 0, end):end + len(marker)]
            time.sleep(0.05)
        return ""

    @contextlib.contextmanager
    def as_default(self) -> Iterator[Daemon]:
        """Point the SDK and the CLI (NODUSLOCAL_SOCKET) at this daemon for a while."""
        old = os.environ.get(SOCKET_ENV)
        os.environ[SOCKET_ENV] = str(self.socket)
        try:
            yield self
        finally:
            if old is None:
                os.environ.pop(SOCKET_ENV, None)
            else:
                os.environ[SOCKET_ENV] = old

    def kill_jobs(self) -> None:
        """SIGKILL every process group a shim of this daemon started (every gang rank's)."""
        for pid_file in [*self.data_dir.glob("jobs/*/attempt-*/pid.json"),
                         *self.data_dir.glob("jobs/*/attempt-*/rank-*/pid.json"),
                         *self.data_dir.glob("jobs/*/attempt-*/index-*/pid.json")]:
            try:
                pid = json.loads(pid_file.read_text())
                # Only a group whose leader is still that job: never a reused id.
                if start_ticks(pid["pgid"]) == pid["start_ticks"]:
                    os.killpg(pid["pgid"], signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass

    def remove_cgroups(self) -> None:
        """Kill what is left in this daemon's host-job cgroups (a job's setsid children)
        and remove them and their parent: a daemon killed -9 leaves them on the box."""
        from noduslocal.daemon.config.settings import SYSTEM_DATA_DIR
        from noduslocal.daemon.runtime.host.cgroups import ROOT, Cgroups, parent_name

        name = parent_name(self.data_dir, SYSTEM_DATA_DIR)
        if os.geteuid() == 0 and (any(ROOT.glob(f"*/{name}")) or (ROOT / name).exists()):
            Cgroups.detect(name).remove_all()

    def unmount_workspaces(self) -> None:
        """Unmount the workspace overlays a daemon killed -9 left mounted (removing the
        tree through them would leave the mounts on the box)."""
        from noduslocal.daemon.files.overlay import overlay_mounts, unmount

        for point in overlay_mounts(self.data_dir):
            with contextlib.suppress(OSError):
                unmount(point)

    def remove_containers(self) -> None:
        """Force-remove every docker container this daemon created (none without docker)."""
        from noduslocal.daemon.runtime.docker.spec import instance_id, job_filter

        try:
            import docker

            client = docker.from_env(timeout=30)
            for container in client.containers.list(
                    all=True, filters=job_filter(instance_id(self.data_dir))):
                with contextlib.suppress(Exception):
                    container.remove(force=True)
            client.close()
        except Exception:  # no docker engine: nothing to remove
            pass

    def cancel_slurm_jobs(self) -> None:
        """scancel every Slurm job this daemon submitted (none without a cluster region)."""
        if self.config_path is None or "regions" not in self.config_path.read_text() \
                or shutil.which("squeue") is None:
            return
        from noduslocal.daemon.runtime.slurm.runtime import TAG, daemon_tag

        prefix = f"{TAG}:{daemon_tag(self.data_dir)}:"
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            listed = subprocess.run(["squeue", "-h", "-o", "%i %k"], capture_output=True,
                                    text=True, timeout=60).stdout
            ids = [line.split()[0] for line in listed.splitlines()
                   if len(line.split()) > 1 and line.split()[1].startswith(prefix)]
            if ids:
                subprocess.run(["scancel", *ids], capture_output=True, timeout=60)

    def close(self) -> None:
        if self.proc is not None:
            self.kill()
        self.cancel_slurm_jobs()
        self.kill_jobs()
        self.remove_cgroups()
        self.remove_containers()
        self.unmount_workspaces()
        try:
            shutil.rmtree(self.root, ignore_errors=True)
        except RecursionError:  # a job left a tree deeper than Python's stack
            subprocess.run(["rm", "-rf", "--", str(self.root)], check=False)


@contextlib.contextmanager
def daemon(**kwargs: object) -> Iterator[Daemon]:
    """A started daemon that the SDK and CLI use until the block ends."""
    instance = Daemon(**kwargs)  # type: ignore[arg-type]
    try:
        instance.start()
        with instance.as_default():
            yield instance
    finally:
        instance.close()


# --- the lifecycle without a daemon --------------------------------------------------------

FAKE_BOOT = "fake-boot"


@dataclass
class FakeRank:
    """A rank the fake runtime launched: the signals it got, and its end, which the test
    decides (exit(), vanish()) unless a signal ends it."""

    job_id: int
    number: int  # the attempt's
    rank: int  # a gang's rank, or an indexed job's index
    handle: Handle
    ended: asyncio.Future[AttemptState]
    signals: list[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.ended.done()

    def exit(self, code: int = 0, sig: int | None = None) -> None:
        """The rank's process exits with `code` (killed by `sig`)."""
        now = time.time()
        self.ended.set_result(Exited(code, sig, now, now))

    def vanish(self, detail: str = "the fake runtime lost it") -> None:
        """The rank is gone with no exit status (a lost box)."""
        self.ended.set_result(Vanished(detail))


class FakeRuntime:
    """An in-memory Runtime (runtime.base) for unit tests: launch() makes FakeRanks at once
    (or when the test releases held launches), their ends are futures the test resolves,
    every call is recorded, and after a restart adopt() finds the ranks that have not
    ended, or judges the attempt by how its ranks ended. Signals are delivered while the
    runtime is reachable: SIGKILL ends a rank (137), SIGTERM too (143) unless
    `ignore_sigterm` (a job that traps it)."""

    def __init__(self, kind: str = "process") -> None:
        self.kind = kind
        self.ranks: list[FakeRank] = []  # every rank launched or adopted, in order
        self.calls: list[tuple[str, Any]] = []  # (method, what it was called with)
        self.unreachable: str | None = None  # its wait_reason; no launch or signal lands
        self.ignore_sigterm = False
        self.refused: dict[str, str] = {}  # job name -> why its launch fails (LaunchFailed)
        self._held: asyncio.Future[None] | None = None  # launches wait on it while set
        self.waiting: list[int] = []  # job ids whose launch waits for release_launches()
        self._serial = 0

    # --- what the test does -----------------------------------------------------------

    def hold_launches(self) -> None:
        """Launches from now on wait (the attempt stays Starting) until release_launches()."""
        if self._held is None:
            self._held = asyncio.get_running_loop().create_future()

    def release_launches(self) -> None:
        if self._held is not None:
            self._held.set_result(None)
            self._held = None

    def of(self, job_id: int, number: int | None = None) -> list[FakeRank]:
        """The job's ranks (of attempt `number`, else of its last attempt), by rank."""
        mine = [r for r in self.ranks if r.job_id == job_id]
        if number is None and mine:
            number = max(r.number for r in mine)
        return sorted((r for r in mine if r.number == number), key=lambda r: r.rank)

    def signals(self, job_id: int) -> list[int]:
        """Every signal the job's ranks got, in order (all ranks and attempts together)."""
        return [what[3] for kind, what in self.calls if kind == "signal" and what[0] == job_id]

    # --- the Runtime protocol ---------------------------------------------------------

    def wait_reason(self) -> str | None:
        return self.unreachable

    def queue_reason(self, handles: list[Handle]) -> Queued | None:
        return None  # its launches run at once: nothing waits in a queue of its own

    async def regions(self) -> list[dict[str, Any]]:
        return []

    async def launch(self, launch: Launch) -> list[Rank]:
        job = launch.ref.job
        if self._held is not None:
            self.waiting.append(job.id)
            try:
                await asyncio.shield(self._held)
            finally:
                self.waiting.remove(job.id)
        if self.unreachable is not None:
            raise NotLaunched(NeverStarted(self.unreachable))
        if job.name in self.refused:
            raise LaunchFailed(self.refused[job.name])
        self.calls.append(("launch", (job.id, launch.ref.number, launch.ranks)))
        now = time.time()
        return [self._rank(job.id, launch.ref.number, rank, now) for rank in launch.ranks]

    def _rank(self, job_id: int, number: int, rank: int, now: float) -> Rank:
        self._serial += 1
        handle = Handle(self.kind, f"fake-{self._serial}", rank, FAKE_BOOT)
        fake = FakeRank(job_id, number, rank, handle,
                        asyncio.get_running_loop().create_future())
        self.ranks.append(fake)
        return Rank(handle, now, fake.ended)

    def _find(self, handle: Handle) -> FakeRank | None:
        return next((r for r in self.ranks if r.handle == handle), None)

    async def adopt(self, launch: Launch, recorded: list[Handle], recorded_running: bool,
                    stopping: bool) -> list[Rank] | AttemptState:
        job = launch.ref.job
        self.calls.append(("adopt", (job.id, launch.ref.number, [h.ref for h in recorded],
                                     recorded_running, stopping)))
        if self.unreachable is not None:
            raise NotLaunched(NeverStarted(self.unreachable))
        found = [r for h in recorded if (r := self._find(h)) is not None
                 and r.rank in launch.ranks]
        if not found:
            return NeverStarted() if not recorded else Vanished("the fake runtime lost it")
        if all(r.done for r in found):  # ended while no lifecycle watched: its verdict
            return found[0].ended.result()
        return [Rank(r.handle, time.time(), r.ended) for r in found]

    async def signal(self, ref: AttemptRef, handle: Handle, sig: int) -> bool:
        rank = self._find(handle)
        if rank is None or rank.done or self.unreachable is not None:
            return False
        self.calls.append(("signal", (rank.job_id, rank.number, rank.rank, sig)))
        rank.signals.append(sig)
        if sig == signal.SIGKILL or (sig == signal.SIGTERM and not self.ignore_sigterm):
            rank.exit(128 + sig, sig)
        return True

    async def clear_lost(self, ref: AttemptRef, handles: list[Handle]) -> None:
        self.calls.append(("clear_lost", (ref.job.id, ref.number)))

    async def release(self, ref: AttemptRef, handles: list[Handle]) -> None:
        self.calls.append(("release", (ref.job.id, ref.number)))

    async def exec(self, launch: Launch, handle: Handle, command: list[str],
                   timeout: float) -> ExecResult:
        self.calls.append(("exec", (launch.ref.job.id, handle.rank, command)))
        return ExecResult(0, "", "", False)

    async def open_terminal(self, launch: Launch, handle: Handle, command: list[str],
                            rows: int, cols: int) -> Terminal:
        self.calls.append(("open_terminal", (launch.ref.job.id, handle.rank, command)))
        raise errors.Unsupported("pty", message="pty: the in-memory runtime has no terminal")

    def log_path(self, directory: Path, stream: str, rank: int = 0) -> Path:
        return rank_dir(directory, rank) / LOG_FILES[stream]

    async def diagnose(self, gpus: bool) -> list[Diagnosis]:
        return [Diagnosis("fake runtime", self.unreachable is None,
                          self.unreachable or "in memory")]


async def eventually(predicate: Callable[[], T | Awaitable[T]], what: str,
                     timeout: float = 30.0) -> T:
    """Await `predicate` (sync or async) until it returns something true and return that;
    fail naming `what` after `timeout` seconds. The lifecycle moves on the same event
    loop, so each look yields to it first."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.005)


@dataclass
class LifecycleHarness:
    """What lifecycle() yields: the parts, the fake runtime, and a few shortcuts."""

    daemon: Daemon  # every part; daemon.live.replace() is a config reload
    runtime: FakeRuntime
    owner: Owner

    @property
    def settings(self) -> Settings:
        return self.daemon.live.current

    @property
    def store(self) -> Store:
        return self.daemon.store

    @property
    def layout(self) -> JobLayout:
        return self.daemon.layout

    @property
    def hub(self) -> EventHub:
        return self.daemon.hub

    @property
    def lifecycle(self) -> Lifecycle:
        return self.daemon.lifecycle

    async def create_job(self, name: str, **fields: Any) -> JobRecord:
        """A job as `Job.create(name=..., **fields)` makes it (command: ["train"])."""
        from noduslocal.domain.validation import parse_create

        req = parse_create({"name": name, "command": ["train"], **fields},
                           regions=self.settings.region_names)
        job, _ = await self.lifecycle.admission.create(req, self.owner, None, None)
        return job

    async def create_sweep(self, name: str, **fields: Any) -> SweepRecord:
        """A sweep as `Sweep.create(name=..., **fields)` makes it (template: ["train"])."""
        from noduslocal.domain.sweep_plan import parse_sweep

        body = {"name": name, "template": {"command": ["train"]}, **fields}
        plan = parse_sweep(body, regions=self.settings.region_names)
        sweep, _ = await self.lifecycle.sweep_admission.create(plan, self.owner, None, None)
        return sweep

    async def job(self, job_id: int) -> JobRecord:
        job = await self.store.job_by_id(job_id)
        assert job is not None, f"no job {job_id}"
        return job

    async def sweep(self, sweep: SweepRecord) -> SweepRecord:
        fresh = await self.store.sweep(sweep.project, sweep.name)
        assert fresh is not None, f"no sweep {sweep.name}"
        return fresh

    async def cells(self, sweep: SweepRecord) -> list[JobRecord]:
        """The sweep's cells, in cell order (a smoke canary is no cell)."""
        ids = [job_id for job_id, _, _ in await self.store.sweep_cells(sweep.id)]
        return await self.store.jobs_by_ids(ids)

    async def phase_of(self, job_id: int, *phases: str) -> JobRecord | None:
        """The job once it is in one of `phases` (for eventually())."""
        job = await self.job(job_id)
        return job if job.phase in phases else None

    async def launched(self, job_id: int, ranks: int = 1) -> list[FakeRank]:
        """The ranks of the job's last attempt, once that many were launched."""
        return await eventually(lambda: len(self.runtime.of(job_id)) >= ranks
                                and self.runtime.of(job_id),
                                f"job {job_id} to be launched")

    async def ended(self, job_id: int) -> JobRecord:
        from noduslocal.domain.states import TERMINAL

        return await eventually(lambda: self.phase_of(job_id, *TERMINAL),
                                f"job {job_id} to end")


@contextlib.asynccontextmanager
async def lifecycle(directory: Path, runtime: FakeRuntime | None = None, *,
                    cpus: float = 4, memory: int = 4 * 2**30, kill_grace: float = 10.0,
                    inventory: Inventory | None = None,
                    **settings: Any) -> AsyncIterator[LifecycleHarness]:
    """The daemon (build.build_daemon, as main.py builds it, not serving the API) on a real
    store under `directory`, its one runtime `runtime` and the GPUs of `inventory` (none
    if not given), started and recovered. Built again on the same directory and runtime,
    it is a restarted daemon: it adopts what still runs there. Settings not given are the
    defaults, except that the disk reserve is 0 (a test's disk need not have 2 GiB free)."""
    from noduslocal.daemon.build import build_daemon
    from noduslocal.daemon.config.settings import Settings
    from noduslocal.daemon.gpus.model import Inventory
    from noduslocal.daemon.store import job_writes

    runtime = runtime or FakeRuntime()
    data_dir = directory / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    config = Settings(**{"socket": directory / "api.sock", "data_dir": data_dir,
                         "cpus_m": int(cpus * 1000), "memory": memory,
                         "kill_grace": kill_grace, "disk_reserve": 0, **settings})
    built = await build_daemon(config, runtimes=[runtime],
                               inventory=inventory or Inventory([], "none", "no GPU inventory"))
    owner = job_writes.Owner(os.getuid(), os.getgid(), pwd.getpwuid(os.getuid()).pw_name,
                             admin=True)
    try:
        await built.start()
        yield LifecycleHarness(built, runtime, owner)
    finally:
        await built.stop()
        await built.close()
