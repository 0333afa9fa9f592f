"""The one interface every runtime implements (host processes, docker; later a cluster):
launch an attempt's ranks, learn each rank's end, signal, adopt or judge after a restart,
exec beside a rank, and where its logs are; with the runtime-neutral types it speaks in
(a rank's end states, an exec's result, the log names). The lifecycle sees only this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from noduslocal.daemon.gpus.model import Gpu, job_env
from noduslocal.daemon.runtime.launchers import RankPlan
from noduslocal.daemon.runtime.shim import OUTPUT_LOG, STDERR_LOG
from noduslocal.domain.jobs import Diagnosis, Handle, JobRecord

# Every runtime writes a rank's logs under the names the shim spells (the shim imports
# nothing of the daemon, so the attempt directory's file names live there, once).
LOG_FILES = {"all": OUTPUT_LOG, "stderr": STDERR_LOG}
OUTPUT_LIMIT = 16 * 1024 * 1024  # bytes of an exec's stdout and of its stderr sent back


@dataclass(frozen=True)
class Exited:
    exit_code: int
    signal: int | None
    started_at: float
    ended_at: float
    # Containers: True when docker says the kernel killed it for memory; None when it was
    # SIGKILLed (exit 137) by nobody we know of, which is most likely the OOM killer too.
    oom_killed: bool | None = False
    # Host shims: the rank's cgroups were seen empty after its end, so its release keeps
    # them for the next rank without reading them again. Only the host runtime reads it:
    # a cluster job's owner can write its exit record.
    cgroups_empty: bool = False


@dataclass(frozen=True)
class Alive:
    shim_pid: int  # 0: the shim holds its lock but has not named its pids yet


@dataclass(frozen=True)
class Vanished:
    """The attempt's shim or container is gone without an exit status we can trust."""

    detail: str | None = None


@dataclass(frozen=True)
class Preempted(Vanished):
    """Lost to the runtime's own scheduler, which took its resources for other work (a
    cluster's preemption): no fault of the job's, so it is queued again without a retry."""


@dataclass(frozen=True)
class NeverStarted:
    """No shim or container ran this attempt, and none ever will (for a shim we left an
    `abandoned` marker). `certain`: the runtime knows it although it launched the attempt
    (a shim that found no room to record the job, and so never started it)."""

    detail: str | None = None
    certain: bool = False


# What became of a rank, in every runtime's words.
AttemptState = Exited | Alive | Vanished | NeverStarted


@dataclass(frozen=True)
class ExecResult:
    """A command run to its end beside a rank (`job exec`), its output at most OUTPUT_LIMIT
    bytes a stream, secrets masked."""

    returncode: int
    stdout: str
    stderr: str
    truncated: bool

    def to_wire(self) -> dict[str, Any]:
        return {"kind": "Process", "returncode": self.returncode, "stdout": self.stdout,
                "stderr": self.stderr, "truncated": self.truncated}


class Terminal(Protocol):
    """A command run beside a rank on a pseudo-terminal (`job exec -it`): its output as it
    comes, keystrokes to it (Ctrl-C reaches its foreground group through the terminal),
    the window's size, and its exit status."""

    async def read(self) -> bytes:
        """What it printed since the last read; b"" once it has ended and all was read."""

    async def write(self, data: bytes) -> None: ...

    async def resize(self, rows: int, cols: int) -> None: ...

    async def wait(self) -> int:
        """Its exit status (128+N when killed by signal N)."""

    async def close(self) -> None:
        """Kill what still runs and free the terminal (the client left, or the job ended)."""


@dataclass
class Rank:
    """A rank that runs: its handle, when it started, and a future of its end. A rank a
    cluster's scheduler queued has `running`, which resolves with the time it started
    there (its `started_at` is then the submission's)."""

    handle: Handle
    started_at: float
    ended: asyncio.Future[AttemptState]
    running: asyncio.Future[float] | None = None


@dataclass(frozen=True)
class GpuGrant:
    """The GPUs an attempt was given (UUIDs; `gpus` the ones the inventory still lists),
    and what a job learns of them."""

    uuids: list[str] = field(default_factory=list)
    gpus: list[Gpu] = field(default_factory=list)
    box_has_gpus: bool = False
    simulated: bool = False
    box_minors: tuple[int, ...] = ()  # every GPU's /dev/nvidiaN on the box

    @property
    def other_minors(self) -> list[int]:
        """The box's GPU nodes this grant may not open (a host job's fence)."""
        return sorted(set(self.box_minors) - {g.device_minor for g in self.gpus})

    def env(self, in_container: bool) -> dict[str, str]:
        return job_env(self.gpus, self.box_has_gpus, in_container, self.simulated)

    @property
    def device_ids(self) -> list[str] | None:
        """The real GPUs a container is given (simulated ones exist only in its env)."""
        return None if self.simulated else list(self.uuids)

    def part(self, rank: int, per_rank: int) -> GpuGrant:
        """A gang rank's share: `per_rank` GPUs in a row (the scheduler ordered them so
        each share is a connected set)."""
        uuids = self.uuids[rank * per_rank:(rank + 1) * per_rank]
        return replace(self, uuids=uuids, gpus=[g for g in self.gpus if g.uuid in uuids])


@dataclass(frozen=True)
class AttemptRef:
    """Which attempt: its job, its number and its directory (logs, pid and exit files)."""

    job: JobRecord
    number: int
    directory: Path
    # An indexed job's index whose start a dead daemon cut off runs again in a directory
    # of a new name (the old one is marked abandoned): index -> that name.
    rank_dirs: Mapping[int, str] = field(default_factory=dict)

    def rank_dir(self, rank: int) -> Path:
        if rank in self.rank_dirs:
            return self.directory / self.rank_dirs[rank]
        return rank_dir(self.directory, rank, self.job.spec.indexed is not None)


@dataclass(frozen=True)
class Launch:
    """All a runtime needs to start, or exec beside, an attempt."""

    ref: AttemptRef
    secrets: dict[str, str]
    gpus: GpuGrant
    master_port: int = 0  # a gang's rendezvous port, chosen by the daemon
    index: int | None = None  # an indexed job's: this launch is that one index

    @property
    def mask(self) -> list[str]:
        return sorted(set(self.secrets.values()))

    @property
    def ranks(self) -> list[int]:
        """The ranks this launch starts or adopts (an indexed job's: its one index)."""
        gang = self.ref.job.spec.gang
        if self.index is not None:
            return [self.index]
        return list(range(1 if gang is None else gang.nodes))

    def index_env(self) -> dict[str, str]:
        indexed = self.ref.job.spec.indexed
        return {} if indexed is None or self.index is None else indexed.env(self.index)

    def rank_gpus(self, rank: int) -> GpuGrant:
        gang = self.ref.job.spec.gang
        return self.gpus if gang is None else self.gpus.part(rank, gang.gpus_per_node)

    def plan(self, rank: int, master_addr: str, rank_addr: str) -> RankPlan | None:
        """A gang rank's rendezvous and command line; None for a job that is no gang."""
        gang, ref = self.ref.job.spec.gang, self.ref
        if gang is None:
            return None
        return RankPlan(gang, rank, master_addr, self.master_port, rank_addr, ref.job.id,
                        ref.number)


@dataclass(frozen=True)
class Queued:
    """A launched attempt waiting in its runtime's own queue: why, in the runtime's words,
    and when the runtime expects it to start (None: it does not say)."""

    why: str
    start_at: float | None = None


class LaunchFailed(RuntimeError):
    """The attempt cannot run (a bad image, a refused start); the message is for the user
    and the job fails StartFailed."""


class NotLaunched(RuntimeError):
    """The attempt did not start, or ended during its launch: `state` says which."""

    def __init__(self, state: AttemptState) -> None:
        super().__init__(str(state))
        self.state = state


class Runtime(Protocol):
    kind: str  # recorded in every handle; the job's spec names the runtime it needs

    def wait_reason(self) -> str | None:
        """Why new attempts cannot be launched now (a queue hold), or None."""

    def queue_reason(self, handles: list[Handle]) -> Queued | None:
        """Why a launched attempt still waits in the runtime's own queue (a cluster's
        scheduler), where it is and when it may start; None for one that is not queued."""

    async def launch(self, launch: Launch) -> list[Rank]:
        """Start every rank, or none (LaunchFailed, NotLaunched)."""

    async def adopt(self, launch: Launch, recorded: list[Handle], recorded_running: bool,
                    stopping: bool) -> list[Rank] | AttemptState:
        """After a daemon restart: the ranks that still run, or what the attempt became.
        `stopping`: we had asked it to stop, so kills seen meanwhile are ours."""

    async def signal(self, ref: AttemptRef, handle: Handle, sig: int) -> bool:
        """False when it could not be delivered (ended, or the runtime unreachable)."""

    async def clear_lost(self, ref: AttemptRef, handles: list[Handle]) -> None:
        """Before a lost attempt is retried: nothing it left may run beside the retry."""

    async def release(self, ref: AttemptRef, handles: list[Handle]) -> None:
        """Once the attempt's end is committed: free what the runtime kept for it."""

    async def exec(self, launch: Launch, handle: Handle, command: list[str],
                   timeout: float) -> ExecResult:
        """Run a command to its end beside a running rank, as the job's owner."""

    async def open_terminal(self, launch: Launch, handle: Handle, command: list[str],
                            rows: int, cols: int) -> Terminal:
        """Start a command beside a running rank on a pseudo-terminal of ROWS x COLS, as
        the job's owner (errors.Unsupported where the runtime cannot)."""

    def log_path(self, directory: Path, stream: str, rank: int = 0) -> Path:
        """Where a rank's log (stream "all" or "stderr") is written."""

    async def diagnose(self, gpus: bool) -> list[Diagnosis]:
        """What `noduslocal doctor` says of this runtime; `gpus`: the box has real GPUs."""

    async def regions(self) -> list[dict[str, Any]]:
        """The cluster regions this runtime submits to, as `noduslocal regions` shows them
        (partitions, nodes, GPUs by type and how many are free); none for this box's."""


@runtime_checkable
class ArrayRuntime(Runtime, Protocol):
    """A runtime whose scheduler runs an indexed job's indexes itself (a Slurm job array):
    one launch for all of them, at most `parallelism` at once; each rank is an index."""

    async def launch_array(self, launch: Launch, indexes: list[int]) -> list[Rank]:
        """Submit INDEXES as one array (LaunchFailed, NotLaunched)."""

    async def adopt_array(self, launch: Launch, indexes: list[int], recorded: list[Handle],
                          stopping: bool) -> list[Rank] | AttemptState:
        """After a restart: ranks for INDEXES (the ones not known to have ended), or what
        the whole array became (NeverStarted: it was never submitted)."""

    @staticmethod
    def index_place(directory: Path, index: int) -> str:
        """Where an index of the attempt in DIRECTORY keeps its logs, relative to it."""


@runtime_checkable
class ArmingRuntime(Runtime, Protocol):
    """A runtime that can make an attempt's launch ahead of its start, held until
    launch() is called for it (the host's: its shim forked and waiting)."""

    def arm(self, launch: Launch) -> bool:
        """Launch ahead, held; False when not (launch() then makes it as usual). The
        caller makes sure the attempt has not started."""

    def armed(self, job_id: int, number: int) -> bool:
        """Whether that attempt is armed (launch() of it lets its shim go at once)."""

    def holds(self, job_id: int, number: int) -> bool:
        """Whether that attempt is armed or being armed."""


def rank_dir(directory: Path, rank: int, indexed: bool = False) -> Path:
    """Where a rank's pid, exit and log files are: the attempt directory for rank 0, a
    directory of its own in there for each further rank; each index of an indexed job has
    one of its own (made when it starts, so a missing one never ran)."""
    if indexed:
        return directory / f"index-{rank}"
    return directory if rank == 0 else directory / f"rank-{rank}"


def failed(state: AttemptState) -> bool:
    """A rank's end that ends its gang: lost, never started, or any exit but a clean 0."""
    return not isinstance(state, Exited) or state.exit_code != 0 or (
        state.oom_killed is not False)
