"""Sources unpacked once per (owner, content) into a root-only snapshot store, and each
task's workspace an overlayfs mount of its own directories over that snapshot: mounted for
an attempt, unmounted at its end, and mounted read-only (its upper over the snapshot) while
a reader looks at an ended task. Where overlayfs cannot be mounted, nothing here is used.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
MS_RDONLY = 1
MNT_DETACH = 2
# In a job's directory (root's, 0700): `upper` and `work` of its overlay and `lower`, the
# name of its snapshot. These files are the one place that says which job uses which
# snapshot; the counts in memory are rebuilt from them at start.
OVERLAY_DIR = ".overlay"
STAGING = ".staging-"  # a snapshot being unpacked; one left by a crash is removed at start
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: Path, fstype: str, flags: int, data: str) -> None:
    if _libc.mount(source.encode(), os.fsencode(target), fstype.encode(), flags,
                   data.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(target))


def _umount(target: Path, flags: int = 0) -> None:
    if _libc.umount2(os.fsencode(target), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(target))


def unmount(target: Path) -> bool:
    """Unmount, detached (MNT_DETACH) when busy: a shell cd'ed into it never wedges the
    daemon; the kernel drops the mount when its last user goes. True: detached."""
    try:
        _umount(target)
        return False
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # not mounted (any more)
            return False
        if exc.errno != errno.EBUSY:
            raise
    _umount(target, MNT_DETACH)
    log.warning("%s was busy (a process has a file or its cwd there): detached; it goes "
                "when its last user does", target)
    return True


def _unescape(field_: str) -> str:
    """A path as /proc/self/mountinfo writes it (space, tab, newline, backslash octal)."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field_ = field_.replace(code, chr(int(code[1:], 8)))
    return field_


def overlay_mounts(under: Path) -> list[Path]:
    """Overlay mount points below `under`, as this process's mount table has them."""
    found = []
    prefix = str(under).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as table:
        for line in table:
            left, _, right = line.partition(" - ")
            point = _unescape(left.split()[4])
            if right.split()[0] == "overlay" and point.startswith(prefix):
                found.append(Path(point))
    return found


AHEAD = -1  # _Mounted.attempt of a mount made before the job's first attempt starts


@dataclass
class _Mounted:
    """An overlay at a job's workspace: `attempt` (> 0, or AHEAD) holds it writable, else
    it is the read-only view `readers` look through."""
    attempt: int = 0
    readers: int = 0


class Overlays:
    def __init__(self, data_dir: Path, jobs_dir: Path, wanted: bool) -> None:
        """`wanted`: the overlay_workspaces setting (False: every source is copied)."""
        self.store = data_dir / "snapshots"
        self.jobs_dir = jobs_dir
        self.wanted = wanted
        self.unavailable: str | None = "not started"  # why overlays are not used
        self._state = threading.Lock()  # _users, _jobs and _unpacking
        # Each job's mounts and its entry in _mounted change under its own lock: one
        # unmount (a sync of the upper's file system) never holds up another job's mount.
        self._jobs: dict[int, threading.Lock] = {}
        self._mounted: dict[int, _Mounted] = {}
        self._settled: set[int] = set()  # jobs ended before their mount made ahead was used
        self._users: dict[str, set[int]] = {}  # snapshot name -> the jobs whose lower it is
        self._unpacking: dict[str, threading.Lock] = {}

    # --- start ----------------------------------------------------------------------------

    def start(self) -> None:
        """Whether overlays can be used here (said once if not), leftovers of a crash
        removed and the snapshots' users counted from the job directories."""
        self.unavailable = self._probe()
        # Counted where overlays are not used this time too: the jobs made of a snapshot
        # earlier keep it, and a release removes it with the last of them, not the first.
        for entry in os.scandir(self.jobs_dir):
            if entry.name.isdigit() and (key := self._lower_of(int(entry.name))):
                self._users.setdefault(key, set()).add(int(entry.name))
        if self.unavailable is not None:
            log.log(logging.WARNING if self.wanted else logging.INFO,
                    "workspaces: overlayfs is not used (%s); each task gets a copy of its "
                    "source", self.unavailable)
            return
        for entry in os.scandir(self.store):
            if entry.name.startswith(STAGING) or entry.name.startswith(".gone-"):
                shutil.rmtree(entry.path, ignore_errors=True)
        for entry in os.scandir(self.store):
            if not entry.name.startswith(".") and entry.name not in self._users:
                shutil.rmtree(self._set_aside(entry.name), ignore_errors=True)

    def _probe(self) -> str | None:
        if not self.wanted:
            return "overlay_workspaces = false"
        if os.getuid() != 0:
            return "the daemon does not run as root"
        self.store.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.store, 0o700)  # overlayfs reads it as root; users never reach it
        probe = self.store / f"{STAGING}probe-{time.time_ns()}"
        try:
            for part in ("lower", "upper", "work", "merged"):
                (probe / part).mkdir(parents=True)
            _mount("overlay", probe / "merged", "overlay", 0,
                   f"lowerdir={probe / 'lower'},upperdir={probe / 'upper'},"
                   f"workdir={probe / 'work'}")
            _umount(probe / "merged")
            return None
        except OSError as exc:
            return f"a test mount failed: {exc.strerror}"
        finally:
            shutil.rmtree(probe, ignore_errors=True)

    def settle(self, held: dict[int, int]) -> list[Path]:
        """At start, before anything runs: the mounts of attempts that may still run
        (`held`: job id -> attempt number) are theirs again; every other overlay under the
        jobs' directory is unmounted. Returns those unmounted."""
        dropped = []
        for point in overlay_mounts(self.jobs_dir):
            job = point.parent.name
            if point.name == "workspace" and job.isdigit() and int(job) in held:
                self._mounted[int(job)] = _Mounted(attempt=held[int(job)])
                continue
            unmount(point)
            dropped.append(point)
        if dropped:
            log.warning("workspaces: unmounted %d overlays no attempt holds (left by the last "
                        "daemon): %s", len(dropped), ", ".join(map(str, dropped[:5])))
        return dropped

    # --- snapshots ------------------------------------------------------------------------

    @staticmethod
    def key(uid: int, sha256: str) -> str:
        return f"{uid}-{sha256}"

    def snapshot(self, uid: int, sha256: str, unpack: Callable[[Path], None]) -> Path:
        """The snapshot of the owner's source, unpacked once: `unpack(staging)` fills a
        fresh directory (as the owner, its cwd there); it is renamed into place whole."""
        key = self.key(uid, sha256)
        with self._state:
            lock = self._unpacking.setdefault(key, threading.Lock())
        with lock:
            final = self.store / key
            if final.is_dir():
                return final
            staging = self.store / f"{STAGING}{key}-{time.time_ns()}"
            staging.mkdir(mode=0o700)
            try:
                unpack(staging)
                os.rename(staging, final)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            return final

    def _lower_of(self, job_id: int) -> str | None:
        try:
            return (self.jobs_dir / str(job_id) / OVERLAY_DIR / "lower").read_text() or None
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _set_aside(self, key: str) -> Path:
        """The snapshot renamed out of every new task's way (removed by the caller, off
        the state lock, or at the next start)."""
        aside = self.store / f".gone-{key}-{time.time_ns()}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(self.store / key, aside)
        return aside

    def snapshots(self) -> list[str]:
        return sorted(e.name for e in os.scandir(self.store) if not e.name.startswith("."))

    def owned(self) -> list[tuple[int, Path]]:
        """Each snapshot with its owner's uid: what their disk use counts once."""
        try:
            names = self.snapshots()
        except FileNotFoundError:
            return []  # overlays never used here
        return [(int(name.split("-", 1)[0]), self.store / name) for name in names]

    # --- a job's overlay ------------------------------------------------------------------

    def uses(self, job_id: int) -> bool:
        """The job's workspace is an overlay (its source was not copied)."""
        return (self.jobs_dir / str(job_id) / OVERLAY_DIR).is_dir()

    def attached(self, job_id: int) -> bool:
        return (self.jobs_dir / str(job_id) / OVERLAY_DIR / "lower").exists()

    def attach(self, job_id: int, uid: int, gid: int, sha256: str,
               unpack: Callable[[Path], None]) -> None:
        """Make the job's upper over the owner's snapshot (unpacked if need be), recorded
        before the first mount."""
        key = self.key(uid, sha256)
        top = self.jobs_dir / str(job_id) / OVERLAY_DIR
        with contextlib.suppress(FileExistsError):
            top.mkdir(mode=0o700)
        for part in ("upper", "work"):
            with contextlib.suppress(FileExistsError):
                (top / part).mkdir(mode=0o700)
        os.chown(top / "upper", uid, gid)  # the merged root is the owner's, as a copy's was
        while True:
            self.snapshot(uid, sha256, unpack)
            with self._state:  # a release of the last user may have dropped it meanwhile
                if (self.store / key).is_dir():
                    self._users.setdefault(key, set()).add(job_id)
                    break
        tmp = top / f"lower.{threading.get_ident()}.tmp"  # prepare_ahead() may race it
        tmp.write_text(key)
        os.rename(tmp, top / "lower")

    def _job(self, job_id: int) -> threading.Lock:
        with self._state:
            return self._jobs.setdefault(job_id, threading.Lock())

    def mount(self, job_id: int, attempt: int) -> None:
        """The job's workspace writable for `attempt` (a reader's view, if one is up,
        is unmounted first)."""
        workspace = self.jobs_dir / str(job_id) / "workspace"
        with self._job(job_id):
            now = self._mounted.get(job_id)
            if now is not None and now.attempt:  # its last attempt's, not yet unmounted
                now.attempt = attempt
                return
            if now is not None:
                unmount(workspace)
            self._mount_rw(job_id)
            self._mounted[job_id] = _Mounted(attempt=attempt,
                                             readers=now.readers if now else 0)

    def mount_ahead(self, job_id: int) -> None:
        """A sweep's next cell mounted before its start, off its path; its first attempt
        takes the mount (mount()), or its end without one removes it (settled())."""
        with self._job(job_id):
            if job_id in self._mounted or job_id in self._settled:
                return
            self._mount_rw(job_id)
            self._mounted[job_id] = _Mounted(attempt=AHEAD)

    def settled(self, job_id: int) -> None:
        """The job ended (or will wait, not started, for a while): a mount made ahead for
        it goes, and none is made for it from now on."""
        with self._job(job_id):
            self._settled.add(job_id)
        self.end(job_id, AHEAD)

    def _mount_rw(self, job_id: int) -> None:
        top = self.jobs_dir / str(job_id) / OVERLAY_DIR
        lower = self.store / (top / "lower").read_text()
        _mount("overlay", self.jobs_dir / str(job_id) / "workspace", "overlay", 0,
               f"lowerdir={lower},upperdir={top / 'upper'},workdir={top / 'work'}")

    def end(self, job_id: int, attempt: int) -> None:
        """Attempt `attempt` is over: its mount goes (not if a later attempt took it)."""
        workspace = self.jobs_dir / str(job_id) / "workspace"
        with self._job(job_id):
            now = self._mounted.get(job_id)
            if now is None or now.attempt != attempt:
                return
            unmount(workspace)
            if not now.readers:
                del self._mounted[job_id]
                return
            # Readers who came while it ran read by path: the view takes the mount's place.
            self._mount_view(job_id, workspace)
            now.attempt = 0

    @contextlib.contextmanager
    def reading(self, job_id: int) -> Iterator[None]:
        """While in it, the job's workspace path shows its merged view: the attempt's mount,
        or a read-only overlay of its upper over its snapshot (the kernel applies the
        upper's whiteouts), unmounted when the last reader is done."""
        workspace = self.jobs_dir / str(job_id) / "workspace"
        with self._job(job_id):
            now = self._mounted.get(job_id)
            if now is None:
                key = self._lower_of(job_id)
                if key is None or not workspace.is_dir():
                    now = None  # no overlay (a copy, or freed): the path is what it is
                else:
                    self._mount_view(job_id, workspace)
                    now = self._mounted[job_id] = _Mounted()
            if now is not None:
                now.readers += 1
        try:
            yield
        finally:
            if now is not None:
                with self._job(job_id):
                    now.readers -= 1
                    if (not now.readers and not now.attempt
                            and self._mounted.get(job_id) is now):
                        unmount(workspace)
                        del self._mounted[job_id]

    def _mount_view(self, job_id: int, workspace: Path) -> None:
        top = self.jobs_dir / str(job_id) / OVERLAY_DIR
        key = (top / "lower").read_text()
        _mount("overlay", workspace, "overlay", MS_RDONLY,
               f"lowerdir={top / 'upper'}:{self.store / key}")

    def release(self, job_id: int) -> None:
        """The job's workspace is being freed: its mount (if any) goes, its overlay
        directories are removed, and its snapshot too if no other job uses it."""
        workspace = self.jobs_dir / str(job_id) / "workspace"
        aside = None
        with self._job(job_id):
            if self._mounted.pop(job_id, None) is not None or os.path.ismount(workspace):
                unmount(workspace)
            key = self._lower_of(job_id)
            top = self.jobs_dir / str(job_id) / OVERLAY_DIR
            gone = top.with_name(f"{OVERLAY_DIR}-gone-{time.time_ns()}")
            try:
                os.rename(top, gone)
            except FileNotFoundError:
                return  # a copied workspace
        with self._state:
            self._jobs.pop(job_id, None)
            self._settled.discard(job_id)
            users = self._users.get(key or "", set())
            users.discard(job_id)
            if key is not None and not users:
                self._users.pop(key, None)
                aside = self._set_aside(key)
        shutil.rmtree(gone, ignore_errors=True)  # off the lock: uppers may be large
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)

    def stale(self) -> list[Path]:
        """Overlays mounted under the jobs' directory that neither an attempt (running, or
        ending) nor a reader of this daemon holds."""
        held = set(self._mounted)  # one step under the GIL: never torn by a mount
        return [p for p in overlay_mounts(self.jobs_dir)
                if not (p.name == "workspace" and p.parent.name.isdigit()
                        and int(p.parent.name) in held)]

    def is_ahead(self, job_id: int) -> bool:
        now = self._mounted.get(job_id)
        return now is not None and now.attempt == AHEAD

    def holds(self, job_id: int) -> bool:
        """The job's workspace is mounted by this daemon (an attempt's, or a view)."""
        return job_id in self._mounted

    def count_mounted(self) -> int:
        return len(self._mounted)
