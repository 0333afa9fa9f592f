"""The host runtime: each rank a process group under a shim that outlives the daemon, in a
cgroup of its own (its limits; every process found and killed through it) and a mount
namespace of its own (namespace.py), its exit recorded in the attempt directory; adopted
again after a restart by the shim's lock; its shim's request (shim_request.py) gets the
rank's cgroups and mounts here. An attempt about to start may be armed: its shim launched
ahead and held until its start lets it go, so the start pays for a signal, not a launch.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noduslocal.daemon.coarse_timer import CoarseTimer
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.runtime import shim
from noduslocal.daemon.runtime.attempt_dir import (
    has_exit,
    kill_leftovers,
    may_still_start,
    read_pid,
    settled_inspect,
)
from noduslocal.daemon.runtime.base import (
    LOG_FILES,
    Alive,
    AttemptRef,
    AttemptState,
    ExecResult,
    Exited,
    Handle,
    Launch,
    LaunchFailed,
    NotLaunched,
    Queued,
    Rank,
    Terminal,
    rank_dir,
)
from noduslocal.daemon.runtime.gang_launch import adopted, launch_ranks
from noduslocal.daemon.runtime.host.cgroups import (
    Cgroups,
    Limits,
    cgroup_name,
    parse_cgroup_name,
)
from noduslocal.daemon.runtime.host.execute import (
    has_own_namespace,
    kill_orphaned_execs,
    run_in_job,
)
from noduslocal.daemon.runtime.host.namespace import Namespaces
from noduslocal.daemon.runtime.host.spawner import Spawner, SpawnError
from noduslocal.daemon.runtime.host.terminal import PtyTerminal
from noduslocal.daemon.runtime.shim_request import launch_request
from noduslocal.domain.job_paths import in_workspace
from noduslocal.domain.jobs import Diagnosis, JobRecord

log = logging.getLogger(__name__)
EXEC_RECORDS = "execs"  # in the data directory: the host execs that run
LOOPBACK = "127.0.0.1"
ARM_TTL = 30.0  # seconds (to twice that) an armed shim waits for its start before it goes
ARM_HOLD = 600  # seconds an armed shim waits at most on its own (a daemon that forgot it)
ARMED_MAX = 16  # armed shims at once on the box
ARMED_PER_USER = 4  # armed shims at once of one owner's jobs

AttemptKey = tuple[int, int]  # (job id, attempt number)


@dataclass
class Armed:
    """A shim launched ahead of its attempt's start and held before it touches the
    attempt's directory (shim.c's held_until_go)."""

    pid: int
    pidfd: int
    cgroup: str | None  # the rank's, made at the arming (empty: only the job enters it)
    mark: str  # its request's go mark ("": none), set on the directory at its go
    expiry: int = -1  # its key in the runtime's expiry timer


class GoMarks:
    """The go marks (shim.GO_MARK) put on a rank's directory before its shim may take the
    lock: a shim runs only under the mark its request names. A start let go before its
    commit (an armed one) can then be fenced off by a restarted daemon that takes its
    made-ahead directory as it is (attempt_dir.disarm), instead of running twice."""

    def __init__(self) -> None:
        self._prefix = os.urandom(6).hex()  # unique across daemons and restarts
        self._count = itertools.count()
        self.why_not: str | None = None  # set once the data dir's file system took none

    def new(self) -> str:
        """A mark for one request; "" where marks cannot be set (no check in the shim)."""
        return "" if self.why_not is not None else f"{self._prefix}-{next(self._count)}"

    def probe(self, directory: Path) -> None:
        """Whether the data dir's file system takes marks, said at the start."""
        try:
            os.setxattr(directory, shim.GO_MARK, b"probe")
            os.removexattr(directory, shim.GO_MARK)
        except OSError as exc:
            self._refused(exc)

    def put(self, directory: Path, mark: str) -> bool:
        """The directory marked for the request naming `mark`; False when it could not be
        (the request must then be one without a mark)."""
        try:
            os.setxattr(directory, shim.GO_MARK, mark.encode())
            return True
        except OSError as exc:
            self._refused(exc)
            if exc.errno != errno.EOPNOTSUPP:  # said once at the start for those
                log.warning("marking %s for its shim failed (%s): this start is not "
                            "fenced from a shim let go just before a kill -9 of the "
                            "daemon", directory, exc)
            return False

    def _refused(self, exc: OSError) -> None:
        if exc.errno == errno.EOPNOTSUPP and self.why_not is None:
            self.why_not = str(exc)
            log.warning("the data directory's file system takes no extended attributes "
                        "(%s): a host job's shim let go just before a kill -9 of the daemon "
                        "and still not at its lock when the daemon is back may run its "
                        "first attempt twice", exc)


class HostRuntime:
    kind = "process"

    def __init__(self, layout: JobLayout, spawner: Spawner | None = None,
                 cgroups: Cgroups | None = None,
                 pids_max: Callable[[], int] = lambda: 4096) -> None:
        """`cgroups`: where each rank's cgroup is made (None or disabled: ranks run
        without, their limits reservations only); `pids_max`: the processes a rank may
        hold, read at each launch (the live host_pids_max)."""
        self.layout = layout
        self.spawner = spawner or Spawner()
        self.cgroups = cgroups or Cgroups(0, [], [], "none configured")
        self.pids_max = pids_max
        self.exec_records = layout.jobs_dir.parent / EXEC_RECORDS
        self.namespaces = Namespaces(False, "the runtime has not started")
        self.marks = GoMarks()
        # Every arming, from its request on: a launch of that attempt waits for it and
        # uses it. Nothing else takes one out but its expiry and close().
        self._armed: dict[AttemptKey, asyncio.Future[Armed | None]] = {}
        self._arm_owners: dict[AttemptKey, int] = {}
        self._arm_expiry = CoarseTimer(ARM_TTL)
        self._arming: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        # Execs a daemon killed meanwhile left running: their callers and their timeouts
        # died with it, whether their jobs still run or not.
        self.exec_records.mkdir(mode=0o700, exist_ok=True)
        self.marks.probe(self.exec_records)
        if killed := kill_orphaned_execs(self.exec_records):
            log.warning("killed %d processes of execs the last daemon left running", killed)
        if self.cgroups.enabled:
            # Of the attempts the last daemon ran, those that ended hold no process.
            if removed := await asyncio.to_thread(self.cgroups.remove_unheld,
                                                  self._may_start):
                log.info("removed %d cgroups of ended host attempts", removed)
        else:
            log.warning("%s", self.cgroups.describe())
        self.namespaces = await asyncio.to_thread(Namespaces.prepare,
                                                  self.layout.jobs_dir.parent)
        if not self.namespaces.enabled:
            log.warning("%s", self.namespaces.describe())
        await self.spawner.start()

    def _may_start(self, cgroup: str) -> bool:
        """The rank of this cgroup may still start its job (attempt_dir.may_still_start):
        the rank's directory is an index's where the job is indexed (its cgroup is named
        for the index, and the daemon makes the index's directory before the cgroup). A
        disk that fails the look keeps the cgroup: an empty one left is harmless, one
        removed under a job fails it."""
        parsed = parse_cgroup_name(cgroup)
        if parsed is None:
            return False
        job_id, number, rank = parsed
        attempt = self.layout.attempt_dir(job_id, number)
        try:
            index = rank_dir(attempt, rank, indexed=True)
            return may_still_start(index if index.is_dir() else rank_dir(attempt, rank))
        except OSError as exc:
            log.warning("keeping cgroup %s: reading its attempt failed: %s", cgroup, exc)
            return True

    async def close(self) -> None:
        self._arm_expiry.close()
        for task in list(self._arming):
            await task
        for key in list(self._armed):
            self._let_go(key)
        await self.spawner.close()
        # Its parent goes too when no job runs on in it (a test's daemon leaves none).
        await asyncio.to_thread(self.cgroups.remove_parents)

    def wait_reason(self) -> str | None:
        return None

    def queue_reason(self, handles: list[Handle]) -> Queued | None:
        return None  # launched here means running: this runtime has no queue of its own

    async def regions(self) -> list[dict[str, Any]]:
        return []  # this box's own region (AdminService describes it)

    async def diagnose(self, gpus: bool) -> list[Diagnosis]:
        del gpus
        limits = [Diagnosis("host job limits", True if self.cgroups.enabled else None,
                            self.cgroups.describe()),
                  Diagnosis("host job namespaces", True if self.namespaces.enabled else None,
                            self.namespaces.describe()),
                  Diagnosis("host job GPU devices", True if self._gpu_fence() else None,
                            self._describe_gpu_fence())]
        if self.spawner.compiled is not None:
            return [Diagnosis("host jobs", True, f"the compiled shim {self.spawner.compiled}"),
                    *limits]
        return [Diagnosis("host jobs", True, "the Python shim (host_shim = \"python\", or no C "
                                             "compiler: apt-get install gcc for the faster one)"),
                *limits]

    def _gpu_fence(self) -> str | None:
        """How a host job is kept from other grants' GPU nodes: "devices" (v1's devices
        cgroup: EPERM, for a root job too), "mounts" (its namespace binds an empty mode-0000
        file over each: EACCES for all but root), or None."""
        if "devices" in self.cgroups.controllers and self.cgroups.enabled:
            return "devices"
        return "mounts" if self.namespaces.enabled else None

    def _describe_gpu_fence(self) -> str:
        fence = self._gpu_fence()
        if fence == "devices":
            return ("the devices cgroup (v1) denies each host job the /dev/nvidia* nodes of "
                    "GPUs not granted to it: opening one fails EPERM, for a root job too")
        if fence == "mounts":
            return ("no devices cgroup here (cgroup v2 would need a BPF program): each host "
                    "job's namespace hides the /dev/nvidia* nodes of GPUs not granted to it "
                    "under an empty mode-0000 file, so opening one fails EACCES (a root job "
                    "could undo that cover)")
        return ("host jobs can open every /dev/nvidia* node: no devices cgroup and no mount "
                "namespace (CUDA_VISIBLE_DEVICES alone pins their GPUs)")

    def _request(self, launch: Launch, rank: int = 0,
                 namespace: bool = True) -> dict[str, Any]:
        """The rank's launch request; `namespace` False: without one (a job an older
        daemon started on the host's paths)."""
        ref = launch.ref
        gpus = launch.rank_gpus(rank)
        world = None
        if self.namespaces.enabled and namespace:
            world = self.namespaces.request(
                self.layout, ref.job,
                gpus.other_minors if self._gpu_fence() == "mounts" else [])
        # Host ranks meet on the loopback: every one listens there, rank 0 at MASTER_PORT.
        return launch_request(self.layout, ref.job, ref.number, launch.secrets,
                              gpus.env(in_container=False),
                              launch.plan(rank, LOOPBACK, LOOPBACK), ref.rank_dir(rank),
                              launch.index_env(), world)

    def _rank(self, ref: AttemptRef, rank: int, shim_pid: int, started_at: float,
              pidfd: int = -1) -> Rank:
        ended = self.spawner.watch(ref.rank_dir(rank), shim_pid, pidfd)
        if self.cgroups.enabled:
            name = cgroup_name(ref.job.id, ref.number, rank)
            ended.add_done_callback(lambda done: self._ended(name, done))
        return Rank(Handle(self.kind, str(shim_pid), rank, self.spawner.boot_id), started_at,
                    ended)

    def _ended(self, cgroup: str, done: asyncio.Future[AttemptState]) -> None:
        if (not done.cancelled() and done.exception() is None
                and isinstance(state := done.result(), Exited) and state.cgroups_empty):
            self.cgroups.ended_empty(cgroup)

    async def launch(self, launch: Launch) -> list[Rank]:
        armed = self._forget((launch.ref.job.id, launch.ref.number))
        if armed is not None and (rank := await self._go(launch, armed)) is not None:
            return [rank]
        return await launch_ranks(launch, lambda rank: self._launch_rank(launch, rank),
                                  lambda rank, sig: self.signal(launch.ref, rank.handle, sig))

    # --- arming: an attempt's shim launched ahead, held until its start ----------------

    def armable(self, launch: Launch) -> bool:
        """Whether this attempt's launch can be made ahead: one rank on no GPU (which GPUs
        an attempt gets is decided at its start), by the compiled shim (the Python one
        cannot be held), and one its launch would not refuse (a path outside /workspace
        where no namespace can be made: launch() says why)."""
        spec = launch.ref.job.spec
        return (self.spawner.compiled is not None and spec.gang is None
                and spec.indexed is None and (spec.gpu is None or spec.gpu.count == 0)
                and not launch.gpus.uuids and launch.index is None
                and (self.namespaces.enabled or outside_workspace(launch.ref.job) is None))

    def arm(self, launch: Launch) -> bool:
        """Launch the attempt's shim now, held before it starts the job until launch()
        lets it go: the fork, the cgroup and the request are paid before the attempt's
        turn, and its start costs a signal. The caller makes sure the attempt has not
        started (it would not be launched again). False when it is not armed: not
        armable, armed already, or the box's or the owner's armed shims are at their cap
        (ARMED_MAX, ARMED_PER_USER). One not started within ARM_TTL (to twice that) is
        let go: it exits having touched nothing."""
        key = (launch.ref.job.id, launch.ref.number)
        owner = launch.ref.job.owner_uid
        if (key in self._armed or not self.armable(launch) or len(self._armed) >= ARMED_MAX
                or sum(1 for uid in self._arm_owners.values() if uid == owner)
                >= ARMED_PER_USER):
            return False
        armed: asyncio.Future[Armed | None] = asyncio.get_running_loop().create_future()
        self._armed[key] = armed
        self._arm_owners[key] = owner
        task = asyncio.create_task(self._arm(launch, armed), name="arm")
        self._arming.add(task)
        task.add_done_callback(self._arming.discard)
        return True

    def holds(self, job_id: int, number: int) -> bool:
        return (job_id, number) in self._armed

    def armed(self, job_id: int, number: int) -> bool:
        armed = self._armed.get((job_id, number))
        return armed is not None and armed.done() and armed.result() is not None

    async def _arm(self, launch: Launch, armed: asyncio.Future[Armed | None]) -> None:
        ref = launch.ref
        key = (ref.job.id, ref.number)
        cgroup = cgroup_name(ref.job.id, ref.number, 0) if self.cgroups.enabled else None
        try:
            request = self._request(launch, 0)
            self._make_cgroups(launch, 0, request)
            request["hold"] = ARM_HOLD
            request["mark"] = self.marks.new()
            pid = await self.spawner.launch(request)
            pidfd = os.pidfd_open(pid)
        except Exception as exc:  # its start launches it as any other
            log.info("arming job %s failed: %s", ref.job.name, exc)
            if cgroup is not None:
                with contextlib.suppress(OSError):
                    self.cgroups.remove_empty(cgroup)
            armed.set_result(None)
            if self._armed.get(key) is armed:
                self._forget(key)
            return
        held = Armed(pid, pidfd, cgroup, request["mark"])
        held.expiry = self._arm_expiry.add(lambda: self._expire(key, armed))
        armed.set_result(held)

    def _expire(self, key: AttemptKey, armed: asyncio.Future[Armed | None]) -> None:
        if self._armed.get(key) is armed:
            self._let_go(key)

    def _forget(self, key: AttemptKey) -> asyncio.Future[Armed | None] | None:
        """The arming of that attempt taken out of the runtime's books, if there is one."""
        self._arm_owners.pop(key, None)
        return self._armed.pop(key, None)

    def _let_go(self, key: AttemptKey) -> None:
        armed = self._forget(key)
        if armed is not None and armed.done() and (held := armed.result()) is not None:
            self._release_armed(held)

    async def _go(self, launch: Launch, armed: asyncio.Future[Armed | None]) -> Rank | None:
        """The armed shim let go to run the job: its rank; None when there is none to
        use (its arming failed, or it has gone), and the launch is made as usual."""
        held = await armed
        if held is None:
            return None
        self._arm_expiry.cancel(held.expiry)
        if not self.armable(launch) or (  # given GPUs after all: its request is not this one
                held.mark and not self.marks.put(launch.ref.rank_dir(0), held.mark)):
            self._release_armed(held)
            return None
        try:
            signal.pidfd_send_signal(held.pidfd, signal.SIGUSR1)
        except ProcessLookupError:
            self._release_armed(held)
            return None
        return self._rank(launch.ref, 0, held.pid, time.time(), held.pidfd)

    def _release_armed(self, held: Armed) -> None:
        """An armed shim told to exit, its cgroup removed (no job entered it)."""
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(held.pidfd, signal.SIGUSR2)
        os.close(held.pidfd)
        if held.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroups.remove_empty(held.cgroup)

    def _make_cgroups(self, launch: Launch, rank: int, request: dict[str, Any]) -> None:
        """The rank's cgroups made with its limits, named in its request (OSError: some
        could not be). On the loop: a few mkdirs and writes; a thread's hop cost more (the
        1,000-task map: 0.6 s more in each of two paired runs)."""
        if not self.cgroups.enabled:
            return
        spec = launch.ref.job.spec
        denied = (launch.rank_gpus(rank).other_minors if self._gpu_fence() == "devices"
                  else [])
        request["cgroups"] = self.cgroups.make(
            cgroup_name(launch.ref.job.id, launch.ref.number, rank),
            Limits(spec.memory, spec.cpu_m, self.pids_max(), denied))

    async def _launch_rank(self, launch: Launch, rank: int) -> Rank:
        ref = launch.ref
        directory = ref.rank_dir(rank)
        if directory != ref.directory:  # the attempt's own was made with it
            directory.mkdir(mode=0o700, exist_ok=True)
        if not self.namespaces.enabled and (outside := outside_workspace(ref.job)):
            raise LaunchFailed(
                f"{outside} is outside /workspace, and a host job sees such a path only in "
                f"a mount namespace, which this daemon cannot make ({self.namespaces.why}); "
                "use a path under /workspace, or an image")
        request = self._request(launch, rank)
        if (mark := self.marks.new()) and self.marks.put(directory, mark):
            request["mark"] = mark
        cgroup = cgroup_name(ref.job.id, ref.number, rank)
        try:
            self._make_cgroups(launch, rank, request)
        except OSError as exc:
            await asyncio.to_thread(self.cgroups.remove, cgroup)
            raise LaunchFailed(f"making the job's cgroup failed: {exc}") from None
        try:
            shim_pid = await self.spawner.launch(request)
        except SpawnError:
            # The spawner died mid-request: the rank's directory says whether a shim
            # started (its lock) before it went.
            log.exception("spawning job %s rank %d failed", ref.job.name, rank)
            state = await settled_inspect(directory)
            if not isinstance(state, Alive):
                await asyncio.to_thread(self.cgroups.remove, cgroup)  # no rank holds it
                raise NotLaunched(state) from None
            shim_pid = state.shim_pid or await shim_of(directory)
        return self._rank(ref, rank, shim_pid, time.time())

    async def adopt(self, launch: Launch, recorded: list[Handle], recorded_running: bool,
                    stopping: bool) -> list[Rank] | AttemptState:
        # A shim that lives holds its lock whatever was recorded; kills are not ours to
        # judge here (the shim recorded the exit status itself).
        del recorded_running, stopping
        ref = launch.ref
        found: list[tuple[int, AttemptState, Rank | None]] = []
        for rank in launch.ranks:
            directory = ref.rank_dir(rank)
            state = await settled_inspect(directory)
            if not isinstance(state, Alive):
                found.append((rank, state, None))
                continue
            shim_pid = state.shim_pid or await shim_of(directory)
            log.info("adopting job %s attempt %d rank %d (shim %d)", ref.job.name,
                     ref.number, rank, shim_pid)
            pid = read_pid(directory)
            found.append((rank, state, self._rank(ref, rank, shim_pid,
                                                  pid["started_at"] if pid else time.time())))
        return adopted(found, self.kind, recorded)

    async def signal(self, ref: AttemptRef, handle: Handle, sig: int) -> bool:
        return await signal_group(ref.rank_dir(handle.rank), sig)

    async def clear_lost(self, ref: AttemptRef, handles: list[Handle]) -> None:
        for handle in handles:
            kill_leftovers(ref.rank_dir(handle.rank), int(handle.ref), handle.boot)
        # The cgroup finds what escaped the group and the session (a double fork).
        await self.release(ref, handles)

    async def release(self, ref: AttemptRef, handles: list[Handle]) -> None:
        """Each rank's cgroup, emptied and removed; the shim leaves its files for the logs."""
        if self.cgroups.enabled:
            names = [cgroup_name(ref.job.id, ref.number, h.rank) for h in handles]
            busy = [name for name in names if not self.cgroups.remove_empty(name)]
            if busy:  # killed and waited for: off the loop
                await asyncio.to_thread(lambda: [self.cgroups.remove(name) for name in busy])

    async def exec(self, launch: Launch, handle: Handle, command: list[str],
                   timeout: float) -> ExecResult:
        # Beside the rank, not inside its process group: with its environment and GPUs,
        # in its mount namespace (where it has one: an adopted job of an older daemon ran
        # on the host's paths).
        await recorded_pid(launch.ref.rank_dir(handle.rank))
        own = has_own_namespace(launch.ref.rank_dir(handle.rank))
        return await run_in_job(self._exec_request(launch, handle.rank, own), command,
                                timeout, self.exec_records)

    async def open_terminal(self, launch: Launch, handle: Handle, command: list[str],
                            rows: int, cols: int) -> Terminal:
        await recorded_pid(launch.ref.rank_dir(handle.rank))
        own = has_own_namespace(launch.ref.rank_dir(handle.rank))
        return await PtyTerminal.start(self._exec_request(launch, handle.rank, own), command,
                                       rows, cols, self.exec_records)

    def _exec_request(self, launch: Launch, rank: int, namespace: bool) -> dict[str, Any]:
        """The rank's launch request for an exec beside it, with the rank's cgroups (those
        that exist: a hierarchy without a limit to hold has none)."""
        request = self._request(launch, rank, namespace)
        if self.cgroups.enabled:
            request["cgroups"] = self.cgroups.admit(
                cgroup_name(launch.ref.job.id, launch.ref.number, rank))
        return request

    def log_path(self, directory: Path, stream: str, rank: int = 0) -> Path:
        return rank_dir(directory, rank) / LOG_FILES[stream]


async def recorded_pid(directory: Path) -> dict[str, Any] | None:
    """The rank's pid.json, which its shim writes once the job's process has started: a
    moment after the launch was answered (the shim's clone returns at the job's exec), so
    a signal or an exec that follows a launch at once waits for it, 2 s at most. None when
    the rank ended first, or none came."""
    for _ in range(200):
        pid = read_pid(directory)
        if pid is not None:
            return pid
        if has_exit(directory):
            return None
        await asyncio.sleep(0.01)
    return None


async def shim_of(directory: Path) -> int:
    """The pid of the shim that holds the rank's lock but has not written pid.json yet (it
    does once the job's process has started); 0 when none came, which its watch then
    judges from the directory at once."""
    pid = await recorded_pid(directory)
    return int(pid["shim_pid"]) if pid is not None else 0


async def signal_group(directory: Path, sig: int) -> bool:
    """Signal a rank's process group (the shim made it; the shim then records the
    end); False when it has already gone. The group is signalled only while its leader
    is the job that pid.json names (same start time), never a group that reused the id."""
    pid = await recorded_pid(directory)
    if pid is None:
        return False
    if has_exit(directory) or shim.start_ticks(pid["pgid"]) != pid.get("start_ticks"):
        return False
    try:
        os.killpg(pid["pgid"], sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# What a host-process attempt is started with (the shim's launch request): argv,
# environment, workdir, the owner's identity and the secret values to mask.

def outside_workspace(job: JobRecord) -> str | None:
    """The first of a host job's checkpoint and volume paths outside /workspace."""
    paths = [*([job.spec.checkpoint] if job.spec.checkpoint else []), *job.spec.volumes]
    return next((f"{path!r}" for path in paths if in_workspace(path) is None), None)
