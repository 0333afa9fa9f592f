"""The host jobs' cgroups: which hierarchy the box has (v2, or v1's memory, cpu, pids,
freezer and devices), this daemon's parent cgroup, one cgroup per attempt's rank with its
limits written (v1: the GPU nodes of other grants denied), its OOM kills read, every
process in it killed, and its removal; v1's cpu and pids cgroups are kept for the next
rank when empty (renamed, not removed and made again).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import logging
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from noduslocal.daemon.runtime.shim import CGROUP_KILL_ROUNDS, oom_kills

log = logging.getLogger(__name__)
ROOT = Path("/sys/fs/cgroup")
SYSTEM_PARENT = "noduslocal"
# freezer: to kill a cgroup at once; devices: the GPU nodes a rank may not open (v2 has no
# such files, only a BPF program: there the job's mount namespace hides them instead).
V1_CONTROLLERS = ("memory", "cpu", "pids", "freezer", "devices")
GPU_MAJOR = 195  # /dev/nvidiaN is c 195:N; nvidiactl (255) and nvidia-modeset (254) stay
V2_CONTROLLERS = ("memory", "cpu", "pids")
CFS_PERIOD_US = 100_000
JOB_PREFIX = "job-"
# v1 hierarchies whose empty cgroup a later rank may take over, renamed: neither holds
# anything of the last rank but counters nobody reads, and their limits are written again
# where they differ. Not memory (pages the last rank cached stay charged to it), nor v2
# (one cgroup for every controller, memory too; and v2 refuses a rename). A rank saves a
# mkdir, a limit's write and an rmdir in each (0.1 ms of CPU and 0.2 ms of its start on
# this box, issue 25 part 5).
POOLED_V1 = ("cpu", "pids")
IDLE_PREFIX = "idle-"
IDLE_MAX = 64  # empty cgroups kept in each pooled hierarchy


@dataclass(frozen=True)
class Limits:
    """What a rank may use: bytes of memory (None: no limit), millicores, processes, and
    the GPU minors (/dev/nvidiaN) it may not open."""

    memory: int | None
    cpu_m: int
    pids_max: int
    denied_gpus: tuple[int, ...] | list[int] = ()


def parent_name(data_dir: Path, system_data_dir: Path) -> str:
    """`noduslocal` for the box's daemon; a daemon of another data dir (a user's own, a
    test's) gets a parent of its own, so its recovery never removes another's cgroups."""
    if data_dir == system_data_dir:
        return SYSTEM_PARENT
    return f"{SYSTEM_PARENT}-{hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]}"


def cgroup_name(job_id: int, attempt: int, rank: int) -> str:
    return f"{JOB_PREFIX}{job_id}-{attempt}-r{rank}"


def parse_cgroup_name(name: str) -> tuple[int, int, int] | None:
    """cgroup_name()'s job id, attempt and rank; None for any other name."""
    found = re.fullmatch(rf"{JOB_PREFIX}([0-9]+)-([0-9]+)-r([0-9]+)", name)
    return None if found is None else (int(found[1]), int(found[2]), int(found[3]))


def _write(path: Path | str, value: str) -> None:
    # cgroupfs takes one write per value, unbuffered (O_TRUNC as runc opens them).
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _procs(directory: Path) -> list[int]:
    try:
        return [int(line) for line in (directory / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


class Cgroups:
    """The cgroups of one daemon's host jobs. `parents`: the parent cgroup in each
    hierarchy used (v2: one); empty when the box offers none we may write, and `why` says
    so (host jobs then run as before: their memory, cpu and pids are reservations only)."""

    def __init__(self, version: int, parents: list[Path], controllers: list[str],
                 why: str = "") -> None:
        self.version = version
        self.parents = parents
        self.controllers = controllers
        self.why = why
        # What make() made, by rank cgroup name: a release removes just those (a v1 box
        # has five hierarchies, a rank uses two or three); unknown after a restart.
        self._made: dict[str, list[str]] = {}
        # Empty cgroups of the pooled hierarchies, by parent: (path, its limit's value).
        self._idle: dict[str, list[tuple[str, str]]] = {}
        self._limits: dict[str, str] = {}  # a pooled rank cgroup's path: its limit's value
        self._idle_names = itertools.count()
        # Ranks whose cgroups a process beside them was sent into (an exec): never kept
        # for another rank, since that process may enter after the rank's end (see admit).
        self._beside: set[str] = set()
        # Ranks whose shim saw their cgroups empty after their end (its exit record says
        # so): kept for the next rank without a read of each cgroup.procs on the loop.
        self._emptied: set[str] = set()

    @property
    def enabled(self) -> bool:
        return bool(self.parents)

    @classmethod
    def detect(cls, name: str, root: Path = ROOT) -> Cgroups:
        """Make (or find) the parent cgroup `name` in the hierarchy the box has."""
        if os.geteuid() != 0 and root == ROOT:
            return cls(0, [], [], "the daemon is not root")
        try:
            if (root / "cgroup.controllers").exists():
                return cls._detect_v2(root, name)
            return cls._detect_v1(root, name)
        except OSError as exc:
            return cls(0, [], [], f"the cgroup file system at {root} is not writable: "
                                  f"{exc.strerror}")

    @classmethod
    def _detect_v2(cls, root: Path, name: str) -> Cgroups:
        offered = (root / "cgroup.controllers").read_text().split()
        wanted = [c for c in V2_CONTROLLERS if c in offered]
        if not wanted:
            return cls(2, [], [], f"cgroup v2 at {root} offers none of memory, cpu, pids")
        enable = " ".join(f"+{c}" for c in wanted)
        # The root may hold processes and still hand controllers down; our parent holds
        # none (v2's rule for a cgroup that does), so its children get them too.
        _write(root / "cgroup.subtree_control", enable)
        parent = root / name
        parent.mkdir(mode=0o755, exist_ok=True)
        _write(parent / "cgroup.subtree_control", enable)
        return cls(2, [parent], wanted)

    @classmethod
    def _detect_v1(cls, root: Path, name: str) -> Cgroups:
        parents, found = [], []
        for controller in V1_CONTROLLERS:
            mount = root / controller
            if not (mount / "cgroup.procs").exists():
                continue
            parent = mount / name
            parent.mkdir(mode=0o755, exist_ok=True)
            parents.append(parent)
            found.append(controller)
        if not [c for c in found if c not in ("freezer", "devices")]:
            return cls(1, [], [], f"no cgroup v1 memory, cpu or pids hierarchy under {root}")
        return cls(1, parents, found)

    def describe(self) -> str:
        if not self.enabled:
            return (f"host jobs run without cgroups ({self.why}): their memory, cpu and "
                    "pids limits are not enforced")
        where = ", ".join(str(p) for p in self.parents)
        return f"cgroup v{self.version} ({', '.join(self.controllers)}) under {where}"

    def paths(self, name: str) -> list[Path]:
        return [parent / name for parent in self.parents]

    def make(self, name: str, limits: Limits) -> list[str]:
        """The rank's cgroup in every hierarchy, limits written; the paths for the shim.
        Each hierarchy gets only its own controller's files, and only those whose value
        differs from a new cgroup's: a launch pays a mkdir per hierarchy and a write per
        limit, not a stat of every file it might have (issue 25, part 5)."""
        made: list[str] = []
        self._made[name] = made
        for controller, parent in zip(self._layout(), self.parents, strict=True):
            if controller == "memory" and not limits.memory:
                # No limit to enforce, and a v1 memory cgroup is the dearest to make and
                # remove (its charges move to the parent): the rank is killed through the
                # others all the same.
                continue
            if controller == "devices" and not limits.denied_gpus:
                continue  # nothing to deny (no GPUs on the box, or all of them granted)
            if controller == "freezer" and "pids" in self.controllers:
                # A kill reads and kills the pids cgroup's processes until none is left:
                # pids.max bounds what a fork storm adds meanwhile, and a task saves the
                # freezer's mkdir, attach and rmdir (issue 25, part 5).
                continue
            if self.version == 1 and controller in POOLED_V1:
                made.append(self._take(parent, name, controller, limits))
                continue
            path = parent / name
            path.mkdir(mode=0o755, exist_ok=True)
            made.append(str(path))
            if self.version == 2:
                self._limit_v2(path, limits)
            else:
                self._limit_v1(controller, path, limits)
        return made

    def _take(self, parent: Path, name: str, controller: str, limits: Limits) -> str:
        """The rank's cgroup `name` in a pooled hierarchy: an idle one renamed, or a new
        one; its limit written unless it holds that value already."""
        value = (str(limits.pids_max) if controller == "pids" else
                 str(limits.cpu_m * CFS_PERIOD_US // 1000) if limits.cpu_m > 0 else "-1")
        where, idle, held = f"{parent}/{name}", self._idle.get(str(parent)), None
        if idle:
            old, value_there = idle.pop()
            with contextlib.suppress(OSError):  # gone meanwhile (an admin's cleanup)
                os.rename(old, where)
                held = value_there
        if held is None:
            try:
                os.mkdir(where, 0o755)
                held = "-1" if controller == "cpu" else ""  # a new cgroup's: no quota
            except FileExistsError:  # left by a daemon before us: its value unknown
                held = ""
        if value != held:
            _write(f"{where}/{'pids.max' if controller == 'pids' else 'cpu.cfs_quota_us'}",
                   value)
        self._limits[where] = value
        return where

    def _keep(self, path: str, seen_empty: bool) -> bool:
        """Keep an empty pooled cgroup for the next rank; False (to be removed) when it is
        not one, processes are still in it, or the pool is full. `seen_empty`: its shim
        saw it empty after the rank's end, and nothing of the rank is left to enter it
        (an exec could: admit() keeps such a rank out of the pool), so it is not read."""
        value = self._limits.get(path)
        if value is None:  # not a pooled hierarchy's, or not made by this daemon
            return False
        parent = os.path.dirname(path)
        idle = self._idle.setdefault(parent, [])
        if len(idle) >= IDLE_MAX:
            return False
        if not seen_empty:
            # Empty or not, not which processes (_procs): three system calls, no file
            # object.
            fd = os.open(os.path.join(path, "cgroup.procs"), os.O_RDONLY | os.O_CLOEXEC)
            try:
                if os.read(fd, 16):
                    return False
            finally:
                os.close(fd)
        kept = os.path.join(parent, f"{IDLE_PREFIX}{next(self._idle_names)}")
        os.rename(path, kept)
        del self._limits[path]
        idle.append((kept, value))
        return True

    def _layout(self) -> list[str]:
        """The controller each parent is for: v1 one hierarchy each, v2 all in one."""
        return ["all"] if self.version == 2 else self.controllers

    def _limit_v2(self, path: Path, limits: Limits) -> None:
        wanted = self.controllers
        if "memory" in wanted:
            _write(path / "memory.max", str(limits.memory) if limits.memory else "max")
            if limits.memory:
                # The limit is the limit, as docker's; a kernel without swap accounting
                # has no such file.
                with contextlib.suppress(FileNotFoundError):
                    _write(path / "memory.swap.max", "0")
        if "cpu" in wanted and limits.cpu_m > 0:
            _write(path / "cpu.max", f"{limits.cpu_m * CFS_PERIOD_US // 1000} {CFS_PERIOD_US}")
        if "pids" in wanted:
            _write(path / "pids.max", str(limits.pids_max))

    @staticmethod
    def _limit_v1(controller: str, path: Path, limits: Limits) -> None:
        if controller == "memory":
            if limits.memory:
                _write(path / "memory.limit_in_bytes", str(limits.memory))
            # 0: the kernel's OOM killer acts at the limit (1 would pause the job instead).
            _write(path / "memory.oom_control", "0")
        elif controller == "cpu" and limits.cpu_m > 0:
            # The period of a new cgroup is CFS_PERIOD_US already (the kernel's default).
            _write(path / "cpu.cfs_quota_us", str(limits.cpu_m * CFS_PERIOD_US // 1000))
        elif controller == "pids":
            _write(path / "pids.max", str(limits.pids_max))
        elif controller == "devices":
            # A new devices cgroup allows what its parent does (all): each other grant's
            # node is taken out of it, for root jobs too (EPERM at open).
            for minor in limits.denied_gpus:
                _write(path / "devices.deny", f"c {GPU_MAJOR}:{minor} rwm")

    def admit(self, name: str) -> list[str]:
        """The rank's cgroups (those that exist), for a process to enter beside the rank:
        an exec, which starts while the rank may be ending. Its cgroups are then removed at
        the release, not kept: an exec that entered by path after the release's emptiness
        check, the instant before a rename into the pool, would otherwise run on in the
        cgroup of the next rank to take it, another user's perhaps."""
        paths = [str(p) for p in self.paths(name) if p.is_dir()]
        if paths:  # none: released already (nothing to keep it from)
            self._beside.add(name)
        return paths

    def oom_kills(self, name: str) -> int:
        return oom_kills([str(p) for p in self.paths(name)])

    def procs(self, name: str) -> list[int]:
        return sorted({pid for path in self.paths(name) for pid in _procs(path)})

    def kill(self, name: str) -> bool:
        """SIGKILL every process in the rank's cgroup, those it forks meanwhile too; True
        once it is empty. v2 has cgroup.kill; v1 freezes it first where the freezer is
        there, so nothing forks between the read of its processes and their kill."""
        paths = [p for p in self.paths(name) if p.exists()]
        for _ in range(CGROUP_KILL_ROUNDS):
            left = False
            frozen = [p for p in paths if (p / "freezer.state").exists()]
            for path in frozen:
                with contextlib.suppress(OSError):
                    _write(path / "freezer.state", "FROZEN")
            for path in paths:
                if (path / "cgroup.kill").exists():
                    with contextlib.suppress(OSError):
                        _write(path / "cgroup.kill", "1")
                for pid in _procs(path):
                    left = True
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            for path in frozen:  # a frozen process dies of its SIGKILL once thawed
                with contextlib.suppress(OSError):
                    _write(path / "freezer.state", "THAWED")
            if not left:
                return True
            time.sleep(0.01)
        return not self.procs(name)

    def ended_empty(self, name: str) -> None:
        """The rank's shim saw its cgroups empty after its end (its exit record)."""
        if name in self._made:
            self._emptied.add(name)

    def remove_empty(self, name: str) -> bool:
        """Remove the rank's cgroup if nothing is left in it, with no wait: True when it is
        gone; False when remove() must see to it (something still in it, or an error to
        say). A release almost always finds it empty: then it costs a few system calls,
        less than a trip to a thread (issue 25, part 5)."""
        if not self.enabled:
            return True
        made = self._made.get(name)
        keep = name not in self._beside
        seen_empty = name in self._emptied
        for path in made if made is not None else map(str, self.paths(name)):
            try:
                if not (keep and self._keep(path, seen_empty)):
                    os.rmdir(path)
            except FileNotFoundError:
                pass  # gone already (an admin's cleanup)
            except OSError:
                return False
            self._limits.pop(path, None)
        self._made.pop(name, None)
        self._beside.discard(name)
        self._emptied.discard(name)
        return True

    def remove(self, name: str) -> None:
        """Kill what is left in the rank's cgroup and remove it (a process that is still
        dying keeps it busy a moment)."""
        if not self.enabled:
            return
        self._made.pop(name, None)  # every hierarchy is looked at: this is the sure way
        self._beside.discard(name)
        self._emptied.discard(name)
        for path in self.paths(name):
            self._limits.pop(str(path), None)
        # The shim killed what its job left at the main process's end, so at release a
        # cgroup is almost always empty and its rmdir succeeds at once; reading its
        # processes, or freezing it, first cost more than the removal (the 1,000-task
        # map's profile). A busy one (EBUSY) is killed, then removed.
        for path in self.paths(name):
            for round_ in range(100):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        log.warning("removing cgroup %s failed: %s", path, exc.strerror)
                        break
                    if round_ == 0:
                        self.kill(name)
                    else:
                        time.sleep(0.01)
            else:
                log.warning("cgroup %s still has processes; left in place", path)

    def remove_parents(self) -> None:
        """The parent cgroups, when empty (a job that runs on keeps them)."""
        self.remove_idle()
        for parent in self.parents:
            with contextlib.suppress(OSError):
                parent.rmdir()

    def remove_idle(self) -> None:
        """The empty cgroups kept for later ranks: this daemon's, and any a daemon killed
        before us left (their values unknown)."""
        self._idle.clear()
        for parent in self.parents:
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(parent):
                    if entry.name.startswith(IDLE_PREFIX) and entry.is_dir():
                        with contextlib.suppress(OSError):
                            os.rmdir(entry.path)

    def names(self) -> list[str]:
        """The rank cgroups under this daemon's parent."""
        return sorted({entry.name for parent in self.parents if parent.exists()
                       for entry in os.scandir(parent)
                       if entry.is_dir() and entry.name.startswith(JOB_PREFIX)})

    def remove_all(self) -> None:
        """Every rank cgroup killed and removed, then the parents: the end of a test's
        daemon, which a kill -9 stopped."""
        for name in self.names():
            self.remove(name)
        self.remove_parents()

    def remove_unheld(self, may_start: Callable[[str], bool] = lambda name: False) -> int:
        """After a restart: remove this daemon's rank cgroups that hold no process (their
        attempts ended, or never started); a non-empty one is an attempt that still runs
        (adopted, released at its end) or one left by a vanished attempt (clear_lost).
        `may_start(name)`: that rank's job may still enter it (a shim let go by the last
        daemon, not yet at its lock): kept, or the job would fail 126 without running; its
        release, or the next restart once recovery has settled it, removes it."""
        self.remove_idle()
        removed = 0
        for name in self.names():
            if self.procs(name) or may_start(name):
                continue
            for path in self.paths(name):  # a rank is made only where it needs to be
                try:
                    path.rmdir()
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    log.warning("removing cgroup %s failed: %s", path, exc.strerror)
            removed += 1
        return removed
