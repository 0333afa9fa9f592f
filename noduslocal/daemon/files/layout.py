"""Where a job lives on disk (its directory, kept workspace and one directory per attempt,
volumes, stored blobs), made with the owner's rights.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from noduslocal.daemon.accounts import account
from noduslocal.daemon.files.blobs import BlobStore
from noduslocal.daemon.files.overlay import OVERLAY_DIR, Overlays
from noduslocal.domain.job_paths import in_workspace
from noduslocal.domain.jobs import JobRecord

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# In each job's directory: the job as the database has it (owner, project, name, spec),
# so that a job whose rows a damaged database lost can be put back (jobs/orphans.py).
RECORD = "job.json"
# What a pending job's directory holds for its first attempt (JobLayout.first_look).
ABSENT, FOREIGN, AHEAD, OTHER = "absent", "foreign", "ahead", "other"
RECORD_XATTR = "user.noduslocal.job"  # the same, as the directory's attribute where it can be
RECORD_XATTR_MAX = 3 * 1024  # bytes: an attribute block holds 4 KiB on ext4; more is a file
POPULATE_TIMEOUT = 600.0  # seconds to unpack a source
JOB_DIRS_KEPT = 4096  # job ids whose directory paths are kept made
# Run as the job's owner in its new workspace ($1; "." for the cwd it was started in, which
# it may not reach by path): $2 = 1 to unpack the tar on stdin,
# then `d PATH` to make a directory and `l PATH TARGET` to link a volume, relative paths.
POPULATE = """set -e
[ "$1" = . ] || cd -- "$1"
if [ "$2" = 1 ]; then tar -x --no-same-owner --no-same-permissions -f -; fi
shift 2
while [ $# -gt 1 ]; do
    case "$1" in
    d) mkdir -p -- "$2"; shift 2 ;;
    l) mkdir -p -- "$(dirname -- "$2")"; ln -s -- "$3" "$2"; shift 3 ;;
    *) exit 2 ;;
    esac
done
"""


def failure_cause(stderr: str, code: int) -> str:
    """What a failed tool said first, the cause; its last line is often only tar's
    "Exiting with failure status due to previous errors"."""
    lines = [line for line in stderr.strip().splitlines()
             if line.strip() and "Exiting with failure status" not in line]
    if not lines:
        return f"exit status {code}"
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    return lines[0] + more


class WorkspaceFailed(RuntimeError):
    """The job's own input could not be laid out (a source that is not a tar, a path its
    owner may not make): the job's failure, not the daemon's."""


def _kept(paths: dict[int, Path], job_id: int, make: Callable[[], Path]) -> Path:
    """A job's path from PATHS, made once (prepare_ahead()'s thread shares them: a dict's
    get and set are atomic, and a clear() only costs a join again)."""
    path = paths.get(job_id)
    if path is None:
        if len(paths) >= JOB_DIRS_KEPT:
            paths.clear()
        path = paths[job_id] = make()
    return path


def _parsed_record(stored: bytes | None, job_id: int) -> dict[str, Any] | None:
    try:
        data = json.loads(stored) if stored is not None else None
    except ValueError:  # torn
        return None
    return data if isinstance(data, dict) and data.get("id") == job_id else None


def _empty(directory: Path) -> bool:
    """Nothing in it, or it is not there (what a killed prepare_ahead() had yet to make)."""
    try:
        return not any(os.scandir(directory))
    except FileNotFoundError:
        return True


class JobLayout:
    def __init__(self, data_dir: Path, overlay: bool = True) -> None:
        """`overlay`: a source becomes a shared snapshot under an overlay per task where
        overlayfs can be mounted (overlay_workspaces), else it is copied into each."""
        self.root = data_dir
        self.jobs_dir = data_dir / "jobs"
        self.volumes_dir = data_dir / "volumes"
        self.blobs = BlobStore(data_dir / "blobs")
        self.overlays = Overlays(data_dir, self.jobs_dir, overlay)
        # What prepare_ahead() (on its thread) and a first attempt's prepare() (on the loop)
        # know of each other, changed under _claims so that one of them makes a job's
        # directories from the start and the other only finishes or takes them.
        self._claims = threading.Lock()
        self._ahead: set[int] = set()  # jobs whose first attempt's directories exist
        # ... all of them made, its source's overlay attached and mounted: its first
        # attempt takes them as they are (no system call on the loop; the mount made ahead
        # becomes the attempt's).
        self._ahead_done: set[int] = set()
        self._coming: set[int] = set()  # handed to prepare_ahead()'s thread, not begun
        self._taken: set[int] = set()  # ... and started meanwhile: the thread skips them
        self._job_dirs: dict[int, Path] = {}  # by job id, made once (_kept)
        self._workspaces: dict[int, Path] = {}
        self._first_attempts: dict[int, Path] = {}  # attempt-1 of each, asked for as often

    def create_root(self) -> None:
        for directory in (self.jobs_dir, self.volumes_dir):
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, 0o711)
        self.overlays.start()

    def volume_dir(self, name: str) -> Path:
        return self.volumes_dir / name

    def job_dir(self, job_id: int) -> Path:
        # Asked for five times a task on the loop, and a Path join costs microseconds.
        return _kept(self._job_dirs, job_id, lambda: self.jobs_dir / str(job_id))

    def write_record(self, job: JobRecord) -> None:
        """The job's record on its directory (readable by root alone: its spec may carry
        tokens in its environment), written once, whole or not at all: an extended
        attribute of the directory where its file system takes one, else a file in it.
        The attribute costs no inode: on a file system without a journal each new inode
        is dearer for every inode deleted in the last minutes (another user's, a test's),
        and a map of `true` made six a task (issue 25, part 5)."""
        directory = self.job_dir(job.id)
        record = {"id": job.id, "project": job.project, "name": job.name,
                  "owner": job.owner, "owner_uid": job.owner_uid,
                  "owner_gid": job.owner_gid, "created_at": job.created_at,
                  "labels": job.labels, "sweep_id": job.sweep_id, "cell": job.cell,
                  "spec": job.spec.to_wire()}
        data = json.dumps(record).encode()
        if len(data) <= RECORD_XATTR_MAX:
            try:
                # The directory is 0711: nobody but its owner (root) may read them.
                os.setxattr(directory, RECORD_XATTR, data, os.XATTR_CREATE)
                return
            except FileExistsError:
                return  # written already (prepare() and prepare_ahead() both write it)
            except OSError:
                pass  # no such attributes here (NFS, an old tmpfs), or no room: a file
        path = directory / RECORD
        if path.exists():
            return
        # A temporary file of this thread's own: prepare() and prepare_ahead() (on
        # another thread) may write the same record at once, and a shared name let one
        # rename the other's away. Both write the same record: whichever rename lands last
        # changes nothing. (A thread's id: mkstemp's random name showed in the map's profile.)
        tmp = path.with_name(f".{RECORD}.{threading.get_ident()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            try:
                os.write(fd, json.dumps(record).encode())
            finally:
                os.close(fd)
            os.rename(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def read_record(self, job_id: int) -> dict[str, Any] | None:
        """The record write_record() left, or None (none written, or torn)."""
        return _parsed_record(self._stored_record(job_id), job_id)

    def has_record(self, job_id: int) -> bool:
        """Whether a record was written (readable or not)."""
        return self._stored_record(job_id) is not None

    def _stored_record(self, job_id: int) -> bytes | None:
        """The record as written, the attribute's or the file's; None where there is none."""
        directory = self.job_dir(job_id)
        try:
            return os.getxattr(directory, RECORD_XATTR)
        except OSError:
            try:
                return (directory / RECORD).read_bytes()
            except OSError:
                return None

    def job_ids_on_disk(self) -> list[int]:
        """Every job that has a directory, by id."""
        try:
            return sorted(int(e.name) for e in os.scandir(self.jobs_dir) if e.name.isdigit())
        except FileNotFoundError:
            return []

    def attempt_dir(self, job_id: int, number: int) -> Path:
        if number == 1:
            return _kept(self._first_attempts, job_id,
                         lambda: self.job_dir(job_id) / "attempt-1")
        return self.job_dir(job_id) / f"attempt-{number}"

    def workspace(self, job_id: int) -> Path:
        return _kept(self._workspaces, job_id, lambda: self.job_dir(job_id) / "workspace")

    def free(self, job_id: int) -> None:
        """Remove an ended job's workspace and a container's checkpoint beside it; its
        attempt directories (logs, exit records) stay. Links in the workspace are removed,
        never followed."""
        self.overlays.release(job_id)  # unmounted first: never removed through its mount
        for path in (self.workspace(job_id), self.job_dir(job_id) / "checkpoint"):
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(path)

    def remove(self, job_id: int) -> None:
        """Remove a removed job's whole directory (workspace, logs, checkpoint): renamed
        aside first, so nothing finds it half gone; links in it are removed, never
        followed."""
        directory = self.job_dir(job_id)
        self.overlays.release(job_id)
        aside = directory.with_name(f".removed-{job_id}-{time.time_ns()}")
        try:
            os.rename(directory, aside)
        except FileNotFoundError:
            return
        shutil.rmtree(aside, ignore_errors=True)

    def checkpoint_dir(self, job: JobRecord) -> Path | None:
        """Where the job's checkpoint lives on the host (None: in a volume, or none)."""
        path = job.spec.checkpoint
        if path is None or path in job.spec.volumes:
            return None
        rel = in_workspace(path)
        return self.workspace(job.id) / rel if rel else self.job_dir(job.id) / "checkpoint"

    def prepare(self, job: JobRecord, number: int) -> Path:
        """Make the attempt's directory, and the job's directory and workspace (owned by the
        job's owner) where an earlier attempt has not; returns the attempt directory."""
        directory = self.attempt_dir(job.id, number)
        done = ahead = False
        if number == 1:
            with self._claims:
                if job.id in self._coming:  # the thread has yet to begin: it never will
                    self._coming.discard(job.id)
                    self._taken.add(job.id)
                done, ahead = job.id in self._ahead_done, job.id in self._ahead
                self._ahead_done.discard(job.id)
                self._ahead.discard(job.id)
        if done:
            if job.spec.source:
                self.overlays.mount(job.id, number)  # takes the mount made ahead
            return directory
        if number == 1 and (ahead or self._made_ahead(job)):
            # Made ahead, perhaps in part, perhaps still being made, perhaps by the daemon
            # before us: what is missing is made here.
            self.job_dir(job.id).mkdir(mode=0o711, exist_ok=True)
            self.write_record(job)
            self.workspace(job.id).mkdir(mode=0o700, exist_ok=True)
            self._own(self.workspace(job.id), job)
            self._fill(self.workspace(job.id), job, number)
            directory.mkdir(mode=0o700, exist_ok=True)
            return directory
        # The first attempt refuses a job directory that exists: one left by another
        # database must not be reused, nor its workspace handed to a new owner. A later
        # attempt may find none (the daemon died before the first one made it).
        self.job_dir(job.id).mkdir(mode=0o711, exist_ok=number > 1)
        self.write_record(job)
        workspace = self.workspace(job.id)
        try:
            workspace.mkdir(mode=0o700)
        except FileExistsError:  # kept from an earlier attempt
            if self.overlays.uses(job.id):
                self.overlays.mount(job.id, number)  # a retry mounts it again
        else:
            self._own(workspace, job)
            self._fill(workspace, job, number)
            checkpoint = self.checkpoint_dir(job)
            if checkpoint is not None and checkpoint.parent == self.job_dir(job.id):
                # A container's checkpoint outside /workspace: beside it, in a directory
                # only root can change, so making it as root and handing it over is safe.
                checkpoint.mkdir(mode=0o700, exist_ok=True)
                self._own(checkpoint, job)
        directory.mkdir(mode=0o700)
        return directory

    def _fill(self, workspace: Path, job: JobRecord, number: int) -> None:
        """A new workspace's contents: its source as an overlay on the owner's snapshot (or
        copied where overlays are not used), then what _populate() makes in it."""
        copy = bool(job.spec.source)
        # A cluster's nodes would not see a mount made here: its jobs get a copy.
        if job.spec.source and self.overlays.unavailable is None and job.spec.region is None:
            self._attach(job)
            self.overlays.mount(job.id, number)
            copy = False
        if (copy or job.spec.checkpoint or job.spec.volumes
                or (job.spec.image and job.spec.workdir)):
            self._populate(workspace, job, copy)

    def ahead_unused(self, job_id: int) -> bool:
        """prepare_ahead() made (or is making) the job's directories and no attempt has
        taken them yet."""
        return job_id in self._ahead or self.overlays.is_ahead(job_id)

    def drop_ahead(self, job_id: int) -> None:
        """The job ended, or was set aside, before an attempt took what was made ahead:
        the mount made ahead goes, and none is made for it any more."""
        with self._claims:
            self._ahead_done.discard(job_id)  # a resumed cell's attempt looks at them again
        self.overlays.settled(job_id)

    def expect_ahead(self, job_ids: list[int]) -> None:
        """Jobs about to be handed to prepare_ahead() on its thread: a first attempt that
        starts before the thread gets to one makes its directories itself, and the thread
        then leaves that one alone."""
        with self._claims:
            self._coming.update(job_ids)

    def _attach(self, job: JobRecord) -> None:
        assert job.spec.source is not None
        if not self.overlays.attached(job.id):
            self.overlays.attach(job.id, job.owner_uid, job.owner_gid, job.spec.source,
                                 lambda into: self._unpack(into, job))

    def _made_ahead(self, job: JobRecord) -> bool:
        """The job's directory holds nothing but what prepare_ahead() makes, empty."""
        found, unfinished = self._first_look(job)
        if found != AHEAD:
            return False
        for name in unfinished:
            with contextlib.suppress(FileNotFoundError):
                (self.job_dir(job.id) / name).unlink()
        return True

    def first_look(self, job: JobRecord) -> str:
        """What the first attempt's prepare() would find in the job's directory, for the
        recovery of a pending job: ABSENT (no directory), FOREIGN (another database's job
        of that id), AHEAD (what prepare_ahead() makes, empty: taken as it is) or OTHER
        (more than that: refused). An overlay the last daemon left mounted over the
        workspace counts as empty when its upper is: the recovery unmounts it before
        anything starts."""
        return self._first_look(job, mounted_empty=True)[0]

    def _first_look(self, job: JobRecord, mounted_empty: bool = False
                    ) -> tuple[str, set[str]]:
        """first_look(), and the names of record files a killed daemon left unfinished."""
        job_id = job.id
        try:
            top = {e.name for e in os.scandir(self.job_dir(job_id))}
            stored = self._stored_record(job_id)
            if stored is not None and (_parsed_record(stored, job_id) or {}).get(
                    "created_at") != job.created_at:
                return FOREIGN, set()  # another database's job of that id
            # A daemon killed while making them leaves them in part: the directory alone,
            # or with a record it never renamed into place. Nothing in them to reuse.
            unfinished = {name for name in top
                          if name.startswith(f".{RECORD}.") and name.endswith(".tmp")}
            workspace = self.workspace(job_id)
            # An overlay's directory made before its upper was is as empty as a missing
            # one (a kill -9 between the two failed a cell "File exists" in CI).
            if not (top - unfinished <= {"workspace", "attempt-1", RECORD, OVERLAY_DIR}
                    and _empty(self.job_dir(job_id) / OVERLAY_DIR / "upper")
                    and ((mounted_empty and os.path.ismount(workspace))
                         or _empty(workspace))
                    and _empty(self.attempt_dir(job_id, 1))):
                return OTHER, set()
        except (FileNotFoundError, NotADirectoryError):
            return ABSENT, set()
        return AHEAD, unfinished

    def prepare_ahead(self, job: JobRecord) -> None:
        """The first attempt's directories of a job about to start (a sweep's next cells),
        made while others run so its start does not wait for them; only for a job whose
        workspace needs nothing put in it but its source's overlay (attached and mounted
        here; its first attempt takes the mount). prepare() then finds them."""
        with self._claims:
            taken = job.id in self._taken
            self._taken.discard(job.id)
            self._coming.discard(job.id)
            if (taken or job.attempts or job.spec.checkpoint or job.spec.volumes
                    or (job.spec.source and (self.overlays.unavailable is not None
                                             or job.spec.region is not None))
                    or (job.spec.image and job.spec.workdir)) or job.id in self._ahead:
                return
            self._ahead.add(job.id)  # first: prepare() may run while these are being made
        try:
            self.job_dir(job.id).mkdir(mode=0o711)
        except OSError:
            self._ahead.discard(job.id)  # not ours to reuse: prepare() decides, as ever
            return
        with contextlib.suppress(OSError):  # made in part: prepare() finishes the rest
            self.write_record(job)
            self.workspace(job.id).mkdir(mode=0o700)
            self._own(self.workspace(job.id), job)
            if job.spec.source:
                self._attach(job)
                self.overlays.mount_ahead(job.id)
            self.attempt_dir(job.id, 1).mkdir(mode=0o700)
            with self._claims:
                if job.id in self._ahead:  # not taken meanwhile
                    self._ahead_done.add(job.id)

    def _unpack(self, directory: Path, job: JobRecord) -> None:
        """The job's source unpacked into a new snapshot directory that the owner's
        unpacking process enters as root first: the store above is root's alone."""
        self._own(directory, job)
        self._populate(directory, job, True, cwd=directory)

    def reading(self, job_id: int) -> contextlib.AbstractContextManager[None]:
        """While in it, the job's workspace path shows what its task wrote over its code
        (an overlay's merged view, mounted for the read if the task has ended)."""
        return self.overlays.reading(job_id)

    def end_attempt(self, job_id: int, number: int) -> None:
        """The attempt's processes are gone: its workspace's mount goes with them."""
        self.overlays.end(job_id, number)

    def _populate(self, workspace: Path, job: JobRecord, unpack: bool,
                  cwd: Path | None = None) -> None:
        """Fill the new workspace as its owner, never as root: the source unpacked by tar,
        the checkpoint directory, the volume links. Whatever a hostile tar or a race by the
        owner's other processes could do, it does with the owner's rights only. `cwd`: the
        directory to fill, entered before the owner's rights are taken (unpack only)."""
        steps: list[str] = []
        container = job.spec.image is not None
        checkpoint = job.spec.checkpoint
        if (checkpoint is not None and checkpoint not in job.spec.volumes
                and (rel := in_workspace(checkpoint))):
            steps += ["d", rel]
        if container and job.spec.workdir and (rel := in_workspace(job.spec.workdir)):
            steps += ["d", rel]  # else docker makes it, as root
        for path, volume in job.spec.volumes.items():
            if not container:
                # A host job's under /workspace: a link, which its mount namespace shows
                # too (and a daemon without one); its namespace binds the others.
                if rel := in_workspace(path):
                    steps += ["l", rel, str(self.volume_dir(volume))]
            elif rel := in_workspace(path):
                # The mount point, made by the owner: docker would make it as root.
                steps += ["d", rel]
        if cwd is not None:
            steps = []
        argv = ["/bin/sh", "-c", POPULATE, "populate", "." if cwd else str(workspace),
                "1" if unpack else "0", *steps]
        kwargs: dict[str, Any] = {"cwd": cwd}
        if os.getuid() == 0 and job.owner_uid != 0:
            _, _, groups = account(job.owner_uid, job.owner, job.owner_gid)
            kwargs.update(user=job.owner_uid, group=job.owner_gid, extra_groups=groups)
        with contextlib.ExitStack() as stack:
            stdin = (stack.enter_context(self.blobs.path(job.spec.source).open("rb"))
                     if unpack and job.spec.source else subprocess.DEVNULL)
            done = subprocess.run(argv, stdin=stdin, capture_output=True, text=True,
                                  env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"},
                                  timeout=POPULATE_TIMEOUT, **kwargs)
        if done.returncode != 0:
            raise WorkspaceFailed(f"preparing the workspace failed: "
                                  f"{failure_cause(done.stderr, done.returncode)}")

    @staticmethod
    def _own(path: Path, job: JobRecord) -> None:
        if os.getuid() == 0:
            os.chown(path, job.owner_uid, job.owner_gid, follow_symlinks=False)
