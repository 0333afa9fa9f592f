"""The per-job shim and the spawner that forks it. Stdlib only, run as a script
(`python -I -S shim.py`), so that it imports nothing of the daemon and starts in milliseconds.

The daemon keeps one spawner as its child and writes one JSON request per line to it; the
spawner forks a shim per request and answers with the shim's pid. Each shim leads its own
session, holds an flock on its attempt (its LOCK file here, the directory itself in
shim.c) for its whole life (the daemon's liveness test after a restart), runs the job in a
new process group (and in the rank's cgroups when the request names them: all in them is
killed at the end, OOM kills recorded; and in a mount namespace of its own when it names
mounts: its workspace at /workspace), pumps its output into the log files (each at most
`max_log` bytes: its head, a marker, and its last bytes at the end), and writes exit.json
atomically before it exits, into room it reserved before the job started, so that a disk
the job filled still gets its exit. Shims outlive the spawner and the daemon. Shared by the
runtimes that run a shim (host; a cluster's nodes), its log writer also by docker's;
attempt_dir.py reads what it writes, shim.c is its compiled twin.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import selectors
import signal
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the shim imports what it runs, no more
    from collections.abc import Iterable

# The attempt directory's files: attempt_dir.py and base.LOG_FILES read these names, and
# shim.c spells the same ones.
# The Python shim's lock (and every shim's before issue 25, part 5); the compiled shim
# locks the attempt directory itself, a file fewer for each task (attempt_dir.locked()
# takes both). The Python shim keeps its file: it also runs on a cluster's nodes, whose
# shared file systems may not lock a directory (NFS locks need a file open for writing).
LOCK = "attempt.lock"
PID = "pid.json"
EXIT = "exit.json"
ABANDONED = "abandoned"
NO_ROOM = "no-room"  # made empty by a shim that found no room to record its job
# The attempt directory's attribute a request's "mark" must match once the shim holds the
# lock: set by the daemon before the shim may go, removed by a restarted daemon that takes
# a made-ahead first attempt as it is (attempt_dir.disarm), so that a shim let go just
# before a crash, and late to its lock, runs nothing there.
GO_MARK = "user.noduslocal.go"
OUTPUT_LOG = "output.log"
STDERR_LOG = "stderr.log"
DRAIN_AFTER_EXIT = 2.0  # seconds to keep reading pipes that escaped processes hold open
MAX_LOG = 1 << 30  # a log's cap when the request names none (the daemon's max_log_bytes)
TAIL_MAX = 1 << 20  # most bytes of a capped log's end kept (in memory) for its close
NOTE_ROOM = 512  # bytes of a capped log left for its two notes
RECORD_ROOM = 4096  # bytes reserved on disk for pid.json and exit.json before the job runs
CGROUP_KILL_ROUNDS = 500  # reads of a cgroup's processes, 10 ms apart, until it is empty


def write_json_atomic(directory: str, name: str, data: dict, durable: bool = False) -> None:
    """Write-then-rename, for readers that may look at any moment; with `durable`, synced
    to disk, file and directory entry, before it returns."""
    tmp = os.path.join(directory, f".{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, json.dumps(data).encode())
        if durable:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(directory, name))
    if durable:
        fsync_dir(directory)


def reserve_record(directory: str, name: str) -> int:
    """The temporary file that write_reserved() fills, with RECORD_ROOM bytes allocated
    now: a job that fills the disk cannot take its exit's room. -1 when it cannot be made."""
    tmp = os.path.join(directory, f".{name}.tmp")
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    except OSError:
        return -1
    try:
        os.posix_fallocate(fd, 0, RECORD_ROOM)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return -1
        # A file system without fallocate: the record is written as it comes.
    return fd


def write_reserved(fd: int, directory: str, name: str, data: dict,
                   durable: bool = False) -> None:
    """write_json_atomic() into the file reserve_record() made (closed here); without one
    (fd -1), as write_json_atomic() does."""
    if fd < 0:
        write_json_atomic(directory, name, data, durable)
        return
    try:
        body = json.dumps(data).encode()
        os.pwrite(fd, body, 0)
        os.ftruncate(fd, len(body))
        if durable:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    os.rename(os.path.join(directory, f".{name}.tmp"), os.path.join(directory, name))
    if durable:
        fsync_dir(directory)


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as file:
        return file.read().strip()


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (/proc/PID/stat field 22): with
    the boot id it tells a process from a later one that got the same pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Reset to their defaults in the job: the spawner ignores SIGINT and Python ignores SIGPIPE,
# and an ignored signal stays ignored across exec.
DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE,
                   signal.SIGCHLD, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                   signal.SIGXFSZ)
ENV = "/usr/bin/env"
DEFAULT_EXEC_PATH = "/bin:/usr/bin"  # execvp(3)'s, for an environment without PATH
_children: list[object] = []  # Popen objects, kept so their finalizer never reaps our job


class SetupError(Exception):
    """The job cannot be started; `code` is what a shell would exit with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _resolve(argv0: str, env: dict) -> str:
    if "/" in argv0:
        return argv0
    for entry in env.get("PATH", os.defpath).split(":"):
        candidate = os.path.join(entry or ".", argv0)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    searched = env.get("PATH", os.defpath)
    raise SetupError(127, f"cannot execute {argv0!r}: not found in PATH ({searched}); give the "
                          "job yours with `--export PATH` (the CLI's default) or env PATH=...")


def _spawn_as_owner(req: dict, out_w: int, err_w: int) -> int:
    """Root daemon, another owner: the shim stays root (so the job can neither signal nor
    stop it) and the child drops to the owner's uid, gid and groups in C before exec.
    `env --chdir` enters the workdir and searches PATH after the drop, with the owner's
    rights; its messages (exit 125 for the workdir, 126, 127) land in the job's log."""
    import subprocess

    proc = subprocess.Popen(
        [ENV, "--chdir", req["cwd"], "--", *req["argv"]], executable=ENV, env=req["env"],
        user=req["uid"], group=req["gid"], extra_groups=req.get("groups") or [req["gid"]],
        process_group=0, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
        close_fds=True, restore_signals=True)
    _children.append(proc)
    return proc.pid


# The mount namespace's calls (linux/sched.h, linux/mount.h, linux/prctl.h).
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 1, 2, 4, 32
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 4096, 8192, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS = 38


class _Mounts:
    """The job's mount namespace, made in its child as root (shim.c's make_namespace does
    the same, step for step): unshared, every mount private, the request's `mounts` bound
    at their targets (parents first), the `hide` nodes covered by `hide_with`. A target
    missing on the host is made in a tmpfs "shadow" of its deepest existing directory: the
    tmpfs holds a bind of each entry of that directory and the missing path, and is moved
    over it (over / by a chroot into it), read-only once every mount is made, so nothing
    is made on the host."""

    def __init__(self, staging: str) -> None:
        self.libc = _libc()
        self.staging = staging  # an empty directory of the daemon's (the rank's) to mount on
        self.shadows: list[str] = []

    def _check(self, what: str, result: int) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int,
              data: str | None = None) -> None:
        self._check(f"mount on {target}", self.libc.mount(
            None if source is None else source.encode(), target.encode(),
            None if fstype is None else fstype.encode(), ctypes.c_ulong(flags),
            None if data is None else data.encode()))

    def make(self, req: dict) -> None:
        self._check("unshare", self.libc.unshare(CLONE_NEWNS))
        self.mount(None, "/", None, MS_REC | MS_PRIVATE)
        for source, target in req["mounts"]:
            if not os.path.exists(target):
                self._make_room(target)
            self.mount(source, target, None, MS_BIND | MS_REC)
        for node in req.get("hide") or ():
            self.mount(req["hide_with"], node, None, MS_BIND)
        for top in self.shadows:
            self.mount(None, top, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
                       | MS_NODEV)
        if req.get("no_new_privs"):
            self._check("prctl", self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))

    def _make_room(self, target: str) -> None:
        """Shadow the deepest existing directory of `target` and make the rest in it. As
        root, so only through root's directories: a directory or link another user owns
        (in /tmp, say) could be swapped meanwhile for a link into the host's /etc."""
        base, parts = "/", target.strip("/").split("/")
        while parts:
            probe = os.path.join(base, parts[0])
            try:
                os.lstat(probe)
            except FileNotFoundError:
                break
            base = os.path.realpath(probe)
            _roots_only(target, probe, base)
            parts.pop(0)
        if base not in self.shadows:
            self._shadow(base)
            self.shadows.append(base)
        for part in parts:  # each new: one that appeared since is refused, never entered
            base = os.path.join(base, part)
            os.mkdir(base, 0o755)

    def _shadow(self, base: str) -> None:
        info = os.stat(base)
        staging = self.staging
        self.mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV,
                   f"mode={info.st_mode & 0o7777:o},uid={info.st_uid},gid={info.st_gid}")
        for entry in os.scandir(base):
            inside = os.path.join(staging, entry.name)
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), inside)
                continue
            if entry.is_dir(follow_symlinks=False):
                os.mkdir(inside)
            else:
                os.close(os.open(inside, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
            self.mount(entry.path, inside, None, MS_BIND | MS_REC)
        below = os.path.relpath(staging, base)
        if not below.startswith(".."):
            # The bind of the entry above the staging point copied the tmpfs itself.
            self.libc.umount2(os.path.join(staging, below).encode(), MNT_DETACH)
        if base == "/":
            os.chdir(staging)
            self.mount(".", "/", None, MS_MOVE)
            os.chroot(".")
            os.chdir("/")
        else:
            self.mount(staging, base, None, MS_MOVE)


def _roots_only(target: str, probe: str, resolved: str) -> None:
    """Refuse a mount path through a link or directory that is not root's."""
    paths, path = [probe], "/"
    for part in filter(None, resolved.split("/")):
        path = os.path.join(path, part)
        paths.append(path)
    for path in paths:
        if os.lstat(path).st_uid != 0:
            raise OSError(errno.EPERM, f"the mount path {target} passes through {path}, "
                                       "which is not root's")


_LIBC: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    """The C library's handle, loaded once by the spawner: each shim forked from it has it
    (loaded in each job's child, it cost the Python shim's namespace 8 ms a task)."""
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _spawn_contained(req: dict, out_w: int, err_w: int) -> int:
    """Start the job inside the rank's cgroups (the daemon made them) and its own mount
    namespace: the child enters them before exec, so nothing it runs starts outside. Our
    code runs in the child, so this forks; the owner's identity is dropped after the
    cgroups are entered and the namespace is made (as root), then the workdir is entered
    (inside the namespace) and PATH searched, with the owner's rights."""
    uid = req.get("uid")
    as_owner = uid is not None and uid != os.getuid()
    argv = req["argv"]
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        code = 126
        try:
            os.setpgid(0, 0)
            for sig in DEFAULT_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            _enter_cgroups(req.get("cgroups") or ())
            if req.get("mounts"):
                try:
                    _Mounts(req["dir"]).make(req)
                except OSError as exc:
                    os.write(2, f"noduslocal: cannot make the job's mount namespace: "
                                f"{exc.strerror}\n".encode())
                    os._exit(126)
            if as_owner:
                os.setgroups(req.get("groups") or [req["gid"]])
                os.setgid(req["gid"])
                os.setuid(uid)
                os.execve(ENV, [ENV, "--chdir", req["cwd"], "--", *argv], req["env"])
            try:
                os.chdir(req["cwd"])
            except OSError as exc:
                raise SetupError(126, f"cannot enter workdir {req['cwd']}: "
                                      f"{exc.strerror}") from None
            path = _resolve(argv[0], req["env"])
            code = 127
            os.execve(path, argv, req["env"])
        except SetupError as exc:
            with contextlib.suppress(BaseException):
                os.write(2, f"noduslocal: {exc}\n".encode())
            code = exc.code
        except BaseException as exc:  # nothing of the shim's may run on in the child
            with contextlib.suppress(BaseException):
                why = exc.strerror if isinstance(exc, OSError) else str(exc)
                if isinstance(exc, OSError) and exc.errno != errno.ENOENT:
                    code = 126
                os.write(2, f"noduslocal: cannot execute {argv[0]!r}: {why}\n".encode())
        os._exit(code)
    os.close(null)
    with contextlib.suppress(OSError):  # the child does it too: whichever runs first
        os.setpgid(pid, pid)
    return pid


def _spawn_job(req: dict, out_w: int, err_w: int) -> int:
    """Start the job in a process group of its own, with stdin from /dev/null. Without a
    change of user, posix_spawn (vfork) costs a fraction of forking this Python process
    and runs none of our code in the child."""
    if req.get("cgroups") or req.get("mounts"):
        return _spawn_contained(req, out_w, err_w)
    uid = req.get("uid")
    if uid is not None and uid != os.getuid():
        return _spawn_as_owner(req, out_w, err_w)
    cwd = req["cwd"]
    try:
        os.chdir(cwd)  # same user as the job: the kernel checks the job's own rights
    except OSError as exc:
        raise SetupError(126, f"cannot enter workdir {cwd}: {exc.strerror}") from None
    argv = req["argv"]
    path = _resolve(argv[0], req["env"])
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.posix_spawn(
            path, argv, req["env"],
            file_actions=[(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                          (os.POSIX_SPAWN_DUP2, err_w, 2)],
            setpgroup=0, setsigdef=DEFAULT_SIGNALS, setsigmask=())
    except OSError as exc:
        raise SetupError(127 if exc.errno == 2 else 126,
                         f"cannot execute {argv[0]!r}: {exc.strerror}") from None
    finally:
        os.close(null)


def _occurrences(data: bytes, needle: bytes) -> list[int]:
    found, index = [], data.find(needle)
    while index >= 0:
        found.append(index)
        index = data.find(needle, index + 1)
    return found


class Masker:
    """Replaces secret values with *** in one output stream. An end of the output that could
    be the start of a secret is held back until more output (or the end of the stream)
    shows whether it is, so a value split across two writes is masked too."""

    def __init__(self, secrets: list[bytes]) -> None:
        self.secrets = [s for s in secrets if s]
        self.keep = max((len(s) for s in self.secrets), default=1) - 1
        self.held = b""

    def feed(self, chunk: bytes, final: bool = False) -> bytes:
        if not self.secrets:
            return chunk
        data, out, pos = self.held + chunk, bytearray(), 0
        # Every occurrence of every secret, overlapping ones merged, becomes one ***.
        spans = sorted((i, i + len(s)) for s in self.secrets
                       for i in _occurrences(data, s))
        for start, end in spans:
            if start < pos:  # overlaps the span just masked: extend it
                if end > pos:
                    pos = end
                continue
            out += data[pos:start] + b"***"
            pos = end
        cut = len(data)
        if not final:
            for size in range(min(self.keep, len(data) - pos), 0, -1):
                if any(s.startswith(data[-size:]) for s in self.secrets):
                    cut -= size
                    break
        out += data[pos:cut]
        self.held = data[cut:]
        return bytes(out)


class CappedLog:
    """One log file of at most `cap` bytes (0: no cap). Past its head comes a marker line;
    what the job prints after it is counted, its last bytes kept in memory and written
    after a second note by close(): a runaway job's log shows how it began and how it
    ended (docs/decisions.md). Output the disk has no room for is counted too, and said
    where it went missing once there is room again: a job is never held up for its log."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd = fd
        self.cap = cap
        self.tail_room = min(cap // 4, TAIL_MAX)
        self.head = max(0, cap - self.tail_room - NOTE_ROOM)
        self.size = os.fstat(fd).st_size  # what the file holds (a setup line, say)
        self.last = b"\n"  # the last byte written: a note starts on a line of its own
        self.cut = False
        self.left_out = 0
        self.tail = bytearray()
        self.lost = 0  # bytes no write took since the last that did
        self.why = ""

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self.cut:
            self._keep(data)
            return
        room = max(0, self.head - self.size) if self.cap else len(data)
        self._put(data[:room])
        if len(data) > room:
            self._put(self._line(f"this log reached max_log_bytes ({self.cap} bytes): what "
                                 f"follows is left out, except its last {self.tail_room} "
                                 "bytes, added at the end"))
            self.cut = True
            self._keep(data[room:])

    def close(self) -> None:
        if self.cut:
            tail = bytes(self.tail[-self.tail_room:]) if self.tail_room else b""
            line = tail.find(b"\n")
            if self.left_out > len(tail) and 0 <= line < len(tail) - 1:
                tail = tail[line + 1:]  # from the start of a line
            self._put(self._line(f"{self.left_out - len(tail)} bytes were left out here; "
                                 f"the last {len(tail)} bytes follow"))
            self._put(tail)
        self._put(b"")  # says what went missing at the end, if anything did
        os.close(self.fd)

    def _keep(self, data: bytes) -> None:
        self.left_out += len(data)
        self.tail += data
        if len(self.tail) > 2 * self.tail_room:
            del self.tail[:-self.tail_room]

    def _line(self, text: str) -> bytes:
        return (b"" if self.last == b"\n" else b"\n") + f"[noduslocal] {text}\n".encode()

    def _put(self, data: bytes) -> None:
        if self.lost:
            note = self._line(f"{self.lost} bytes of output were lost here ({self.why})")
            if self._raw(note):
                self.lost += len(data)
                return
            self.lost = 0
        self.lost += self._raw(data)

    def _raw(self, data: bytes) -> int:
        """Write what the file takes; returns the bytes it did not (a full disk)."""
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
                if not written:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError as exc:
                self.why = os.strerror(exc.errno or errno.EIO)
                return len(view)
            self.size += written
            self.last = bytes(view[written - 1:written])
            view = view[written:]
        return 0


class Logs:
    """The attempt's logs, each made on its first output (a job that writes nothing, most
    tasks of a sweep of `true`, costs two files less), each capped at `cap` bytes."""

    def __init__(self, directory: str, cap: int = MAX_LOG) -> None:
        self.directory = directory
        self.cap = cap
        self.logs: dict[str, CappedLog] = {}

    def write(self, names: tuple[str, ...], data: bytes) -> None:
        if not data:
            return
        for name in names:
            log = self.logs.get(name)
            if log is None:
                try:
                    fd = os.open(os.path.join(self.directory, name),
                                 os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
                except OSError:  # no inode for it: tried again with the next output
                    continue
                log = self.logs[name] = CappedLog(fd, self.cap)
            log.write(data)

    def close(self) -> None:
        for log in self.logs.values():
            log.close()


def _write_file(path: str, value: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, value.encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _cgroup_procs(cgroup: str) -> list[int] | None:
    """The cgroup's processes ([] when it is gone); None when it could not be read."""
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as file:
            return [int(line) for line in file.read().split()]
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        return None


def kill_cgroups(cgroups: list[str]) -> bool:
    """SIGKILL every process in the rank's cgroups, what they fork meanwhile too, until
    they are empty: a job's `setsid` child dies with it. v2 kills a cgroup in one write
    (cgroup.kill); v1's freezer stops forks between the read of the pids and the kill.
    True once they were seen empty (the exit record says so: the daemon then keeps them
    for the next rank without reading them again); never when a read failed, since an
    unread cgroup may hold a process that the pool would hand to another rank."""
    unread = False
    for _ in range(CGROUP_KILL_ROUNDS):
        # Read first: most jobs leave nothing, and freezing an empty cgroup is not free.
        listed = [_cgroup_procs(c) for c in cgroups]
        unread = unread or None in listed
        if not any(listed):
            return not unread
        left = False
        frozen = [c for c in cgroups
                  if _write_file(os.path.join(c, "freezer.state"), "FROZEN")]
        for cgroup in cgroups:
            _write_file(os.path.join(cgroup, "cgroup.kill"), "1")
            pids = _cgroup_procs(cgroup)
            unread = unread or pids is None
            for pid in pids or ():
                left = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for cgroup in frozen:  # a frozen process dies of its SIGKILL once thawed
            _write_file(os.path.join(cgroup, "freezer.state"), "THAWED")
        if not left:
            return not unread
        time.sleep(0.01)
    return False


def oom_kills(cgroups: list[str]) -> int:
    """How many processes the kernel's OOM killer killed in the rank's cgroups: the
    `oom_kill N` line of v2's memory.events or v1's memory.oom_control."""
    kills = 0
    for cgroup in cgroups:
        for name in ("memory.events", "memory.oom_control"):
            try:
                with open(os.path.join(cgroup, name)) as file:
                    text = file.read()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    kills += int(value)
    return kills


def _pump(out_r: int, err_r: int, logs: Logs, pid: int, mask: list[bytes],
          cgroups: list[str]) -> tuple[int, bool]:
    """Copy output into the logs until the job exits and its pipes close; return the
    wait status, and whether its cgroups were seen empty after it (kill_cgroups)."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ, ((OUTPUT_LOG,), Masker(mask)))
    sel.register(err_r, selectors.EVENT_READ, ((OUTPUT_LOG, STDERR_LOG), Masker(mask)))
    sel.register(wake_r, selectors.EVENT_READ, None)
    status: int | None = None
    deadline: float | None = None
    emptied = False
    open_pipes = 2
    while open_pipes:
        # Checked before every wait, after the SIGCHLD wake-up is in place: a job that
        # exited before we got here, leaving a child that holds its pipes, is not missed.
        if status is None:
            done, wstatus = os.waitpid(pid, os.WNOHANG)
            if done:
                status = wstatus
                # Like a container: when the main process ends, the rest of its group
                # goes, and all else in its cgroup (a `setsid` child).
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                emptied = kill_cgroups(cgroups)
                deadline = time.monotonic() + DRAIN_AFTER_EXIT
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = sel.select(timeout)
        if not ready and deadline is not None:
            break  # escaped processes still hold the pipes: stop reading them
        for key, _ in ready:
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                continue
            targets, masker = key.data
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fd)
                os.close(key.fd)
                open_pipes -= 1
            logs.write(targets, masker.feed(chunk, final=not chunk))
    for key in list(sel.get_map().values()):
        if key.data is not None:  # a pipe still held open: write what the masker held back
            targets, masker = key.data
            logs.write(targets, masker.feed(b"", final=True))
    if status is None:
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        emptied = kill_cgroups(cgroups)
    logs.close()
    return status, emptied


def _record_setup_failure(logs: Logs, exit_record: int, exc: SetupError, started: float,
                          durable: bool) -> None:
    logs.write((OUTPUT_LOG, STDERR_LOG), f"noduslocal: {exc}\n".encode())
    logs.close()
    write_reserved(exit_record, logs.directory, EXIT, {
        "started_at": started, "ended_at": time.time(), "exit_code": exc.code,
        "signal": None}, durable)


def _marked(directory: str, mark: str) -> bool:
    """The directory bears the request's go mark (GO_MARK)."""
    try:
        return os.getxattr(directory, GO_MARK) == mark.encode()
    except OSError:
        return False


def run_shim(req: dict, durable: bool = False) -> None:
    """In the forked shim: run one attempt to its end. Never returns. `durable`: the exit
    is synced to disk even while the parent lives (a cluster's batch job: the file is the
    only record the daemon gets)."""
    code = 0
    spawner = os.getppid()
    try:
        os.setsid()  # no terminal reaches the shim or its job
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 65536)
        directory = req["dir"]
        lock = os.open(os.path.join(directory, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                       0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(directory, ABANDONED)):
            os._exit(0)  # a restarted daemon gave up on this attempt before we ran
        if req.get("mark") and not _marked(directory, req["mark"]):
            os._exit(0)  # a restarted daemon took the directory for its own start
        pid_record, exit_record = (reserve_record(directory, PID),
                                   reserve_record(directory, EXIT))
        if pid_record < 0 or exit_record < 0:
            # A job we could not record would run unseen: judged never started after a
            # restart, it would run twice. Not started, it is (and is queued again).
            for fd, name in ((pid_record, PID), (exit_record, EXIT)):
                if fd >= 0:
                    os.close(fd)
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(directory, f".{name}.tmp"))
            with contextlib.suppress(OSError):  # an empty file: a name needs no block
                os.close(os.open(os.path.join(directory, NO_ROOM),
                                 os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
            os._exit(0)
        logs = Logs(directory, req.get("max_log", MAX_LOG))
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        started = time.time()
        try:
            pid = _spawn_job(req, out_w, err_w)
        except SetupError as exc:
            _record_setup_failure(logs, exit_record, exc, started,
                                  durable=durable or os.getppid() != spawner)
            os._exit(0)
        os.close(out_w)
        os.close(err_w)
        write_reserved(pid_record, directory, PID, {
            "shim_pid": os.getpid(), "pid": pid, "pgid": pid, "started_at": started,
            "boot_id": req["boot_id"], "start_ticks": start_ticks(pid)})
        cgroups = req.get("cgroups") or []
        status, emptied = _pump(out_r, err_r, logs, pid,
                                [value.encode() for value in req.get("mask", ())], cgroups)
        result: dict = {"started_at": started, "ended_at": time.time(), "exit_code": None,
                        "signal": None}
        if os.WIFSIGNALED(status):
            result["signal"] = os.WTERMSIG(status)
            result["exit_code"] = 128 + result["signal"]
        else:
            result["exit_code"] = os.waitstatus_to_exitcode(status)
        if cgroups:  # read only for a failure: read_exit ignores it after an exit 0
            result["oom_killed"] = result["exit_code"] != 0 and oom_kills(cgroups) > 0
            if emptied:
                result["cgroups_empty"] = True
        # While the spawner is our parent the daemon is alive and commits this exit to its
        # database within milliseconds, so syncing it here too would only add two device
        # flushes to every job's end (a power loss within the second before that commit
        # is synced loses both, as it would have ended the job: recovery judges the
        # attempt lost). Once the daemon is gone this file is the only record until it
        # returns, and it is made durable.
        write_reserved(exit_record, directory, EXIT, result,
                       durable=durable or os.getppid() != spawner)
    except BaseException:
        code = 1
    os._exit(code)


def serve() -> None:
    """The spawner: fork one shim per request line until the daemon closes our stdin."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)

    def reap(*_: object) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    signal.signal(signal.SIGCHLD, reap)
    _libc()
    boot = boot_id()
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        req = json.loads(line)
        req["boot_id"] = boot
        try:
            pid = os.fork()
        except OSError as exc:
            out.write(json.dumps({"id": req["id"], "error": str(exc)}).encode() + b"\n")
            out.flush()
            continue
        if pid == 0:
            run_shim(req)
        out.write(json.dumps({"id": req["id"], "pid": pid}).encode() + b"\n")
        out.flush()


# What a cluster's batch job finds in its attempt directory: the shim's request, written by
# the daemon for the job's owner alone, read and removed once (it holds the job's secrets).
REQUEST = "request.json"
# Set by the cluster for the job (its node, job id, the GPUs it was given): they win over
# the request's, which the daemon wrote before the cluster chose a node.
CLUSTER_ENV_PREFIXES = ("SLURM_", "SLURMD_")
CLUSTER_ENV = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES",
               "ZE_AFFINITY_MASK")


# A gang's rendezvous as the daemon writes it into each rank's request, before the cluster
# chose nodes: filled in on the nodes (the batch host, the first node, is rank 0's).
MASTER_ADDR_TOKEN = "@@nodus-master-addr@@"
MASTER_PORT_TOKEN = "@@nodus-master-port@@"
RANK_ADDR_TOKEN = "@@nodus-rank-addr@@"


# A cluster attempt's rank R keeps its request, records and logs in this directory of the
# job's, beside the attempt's (the owner's; the attempt directory itself is the daemon's).
NODE_DIR = "cluster-{attempt}-{rank}"


def run_gang(template: str, srun: str, nodes: int) -> None:
    """A cluster gang's batch script (`shim.py --gang TEMPLATE SRUN N`), on its first node:
    a free port chosen here for rank 0's rendezvous, then one `shim.py --rank TEMPLATE` per
    node started by srun (TEMPLATE: each rank's directory, with "{rank}" for its number);
    exits with the first non-zero rank exit (0 when all succeeded)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import socket  # here: this box's shims, which start a job each, never need it

    with socket.socket() as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    os.environ["NODUS_MASTER_ADDR"] = socket.gethostname()
    os.environ["NODUS_MASTER_PORT"] = str(port)
    # 22.05's srun no longer takes the job's CPUs per task from its environment: say it.
    cpus = os.environ.get("SLURM_CPUS_PER_TASK", "1")
    argv = [srun, f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={cpus}", "--kill-on-bad-exit=0", "--export=ALL",
            sys.executable, "-I", "-S",
            os.path.abspath(__file__), "--rank", template]
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            os.execv(srun, argv)
        finally:
            os._exit(127)
    # srun passes a signal on to every rank (whose shims pass it to their jobs).
    for forwarded in FORWARDED:
        signal.signal(forwarded, lambda sig, _frame: os.kill(pid, sig))
    os.waitpid(pid, 0)
    codes = [_recorded_code(template.format(rank=rank)) for rank in range(nodes)]
    sys.exit(next((code for code in codes if code != 0), 0))


def _recorded_code(directory: str) -> int:
    """The exit code a shim recorded in DIRECTORY, as a batch script's status (1: none)."""
    try:
        with open(os.path.join(directory, EXIT), "rb") as file:
            code = json.load(file)["exit_code"]
    except (OSError, ValueError, KeyError, TypeError):
        return 1
    return code if isinstance(code, int) and 0 <= code < 256 else 1


def run_rank(template: str) -> None:
    """One rank of a cluster gang (`shim.py --rank TEMPLATE`, started by srun on its node):
    the rank's own request, with the rendezvous the gang's first node chose."""
    import socket  # as in run_gang

    rank = int(os.environ.get("SLURM_PROCID", "0"))
    run_batch(template.format(rank=rank),
              {MASTER_ADDR_TOKEN: os.environ.get("NODUS_MASTER_ADDR", ""),
               MASTER_PORT_TOKEN: os.environ.get("NODUS_MASTER_PORT", ""),
               RANK_ADDR_TOKEN: socket.gethostname()})


FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGQUIT)


def _forward(directory: str, sig: int) -> None:
    """SIG to the job's process group, while pid.json names the group's leader as the job
    that started then (never a reused id); nothing before the job started."""
    try:
        with open(os.path.join(directory, PID), "rb") as file:
            pid = json.load(file)
        if start_ticks(pid["pgid"]) == pid.get("start_ticks"):
            os.killpg(pid["pgid"], sig)
    except (OSError, ValueError, KeyError, TypeError):
        pass


def _fill(value: str, tokens: dict[str, str]) -> str:
    for token, text in tokens.items():
        value = value.replace(token, text)
    return value


def run_batch(directory: str, tokens: dict[str, str] | None = None) -> None:
    """A cluster's batch job (`shim.py --run DIR`), as the job's owner on a compute node:
    the attempt run by a shim in a child of ours, as the spawner would fork it, and our
    exit the job's, for the cluster's own accounting. A TERM (and the like) that reaches us
    is passed on to the job's session, which Slurm's signals do not reach; the shim ignores
    it, and records the job's end; SIGKILL after the cluster's grace ends us all. `tokens`:
    a gang rank's rendezvous, put where its request has their names."""
    # The job runs in a session of its own, which Slurm's `scancel --signal --full` does
    # not reach: the batch script (we) passes each such signal on to the job's group.
    for forwarded in FORWARDED:
        signal.signal(forwarded, lambda sig, _frame: _forward(directory, sig))
    path = os.path.join(directory, REQUEST)
    try:
        with open(path, "rb") as file:
            req = json.load(file)
        os.unlink(path)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"noduslocal: cannot read the attempt's request {path}: {exc}\n")
        sys.exit(1)
    req["dir"] = directory
    req["boot_id"] = f"cluster:{os.environ.get('SLURMD_NODENAME') or os.uname().nodename}"
    env = dict(req["env"])
    env.update({key: value for key, value in os.environ.items()
                if key.startswith(CLUSTER_ENV_PREFIXES) or key in CLUSTER_ENV})
    if tokens:
        env = {key: _fill(value, tokens) for key, value in env.items()}
        req["argv"] = [_fill(arg, tokens) for arg in req["argv"]]
    req["env"] = env
    pid = os.fork()
    if pid == 0:
        # Only the batch process passes signals on (the job would get each twice); the
        # job's own child sets them back to their defaults before it runs the command.
        for forwarded in FORWARDED:
            signal.signal(forwarded, signal.SIG_IGN)
        run_shim(req, durable=True)
    os.waitpid(pid, 0)
    sys.exit(_recorded_code(directory))


def exec_in(spec: dict) -> None:
    """`job exec` into a host job's mount namespace (its main process, `pid`, started at
    `start_ticks`): enters it and its root as root, drops to the owner, then enters the
    workdir and execs the command. Everything until then was loaded from the host before
    entering: nothing of the namespace, where the job's own directories may lie over
    /usr/bin or /etc, ever runs as root."""
    libc = _libc()
    pid = spec.get("pid")  # None: a job on the host's paths, with no namespace to enter
    ns = root = -1
    if pid is not None:
        try:
            ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            ns = root = -1
        # Checked after the opens: a pid reused before them is another process's namespace.
        if ns < 0 or start_ticks(pid) != spec["start_ticks"]:
            _exec_failed(126, "the job's process has ended; nothing to exec beside")
    # Into the rank's cgroups first (as root, before anything of the job's runs): what the
    # exec uses counts against the job's limits, and a kill of the rank ends it too.
    _enter_cgroups(spec.get("cgroups") or ())
    if pid is not None:
        if libc.setns(ns, CLONE_NEWNS) != 0:
            _exec_failed(126, f"cannot enter the job's namespace: "
                              f"{os.strerror(ctypes.get_errno())}")
        os.fchdir(root)
        os.chroot(".")
    uid = spec.get("uid")
    if uid is not None and uid != os.getuid():
        os.setgroups(spec.get("groups") or [spec["gid"]])
        os.setgid(spec["gid"])
        os.setuid(uid)
    if spec.get("no_new_privs") and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _exec_failed(126, "cannot set no_new_privs")
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        _exec_failed(125, f"cannot enter workdir {spec['cwd']}: {exc.strerror}")
    argv = spec["argv"]
    # PATH searched here, as execvp(3) does: os.execvpe imports a module on its way, which
    # in here would be read from the job's files.
    paths = ([""] if "/" in argv[0] else
             [p or "." for p in os.environ.get("PATH", DEFAULT_EXEC_PATH).split(":")])
    found: OSError | None = None
    for directory in paths:
        try:
            os.execve(os.path.join(directory, argv[0]) if directory else argv[0], argv,
                      os.environ)
        except OSError as exc:
            if found is None or exc.errno != errno.ENOENT:
                found = exc  # the first error that is not "not here", as execvp says
    assert found is not None
    _exec_failed(127 if found.errno == errno.ENOENT else 126,
                 f"cannot execute {argv[0]!r}: {found.strerror}")


def _enter_cgroups(cgroups: Iterable[str]) -> None:
    """This process into each of a rank's cgroups (a job's child, or an exec beside it),
    or exit 126 saying which it could not enter. Called by the thread that then execs the
    command: on v1 it moves itself, "0" in `tasks`, as shim.c's enter_cgroup() does and
    for its reason (no threadgroup lock, so no RCU grace period to wait for); v2 has no
    `tasks`: the pid in cgroup.procs."""
    for cgroup in cgroups:
        try:
            try:
                fd = os.open(os.path.join(cgroup, "tasks"), os.O_WRONLY)
                value = b"0"
            except FileNotFoundError:
                fd = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY)
                value = str(os.getpid()).encode()
            try:
                os.write(fd, value)
            finally:
                os.close(fd)
        except OSError as exc:
            _exec_failed(126, f"cannot enter cgroup {cgroup}: {exc.strerror}")


def _exec_failed(code: int, message: str) -> None:
    os.write(2, f"noduslocal: {message}\n".encode())
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--exec-in"]:
        exec_in(json.loads(sys.argv[2]))
    elif sys.argv[1:2] == ["--run"]:
        run_batch(sys.argv[2])
    elif sys.argv[1:2] == ["--gang"]:
        run_gang(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1:2] == ["--rank"]:
        run_rank(sys.argv[2])
    else:
        serve()
