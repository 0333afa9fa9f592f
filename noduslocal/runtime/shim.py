"""The per-job shim and the spawner that forks it. Stdlib only, run as a script
(`python -I -S shim.py`), so that it imports nothing of the daemon and starts in milliseconds.

The daemon keeps one spawner as its child and writes one JSON request per line to it; the
spawner forks a shim per request and answers with the shim's pid. Each shim leads its own
session, holds an flock on its attempt directory for its whole life (the daemon's liveness
test after a restart), runs the job in a new process group, pumps its output into the log
files, and writes exit.json atomically before it exits. Shims outlive the spawner and the
daemon.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import signal
import sys
import time

# os.execvpe imports `warnings` lazily; after the drop to the job owner's uid that import
# can fail (the interpreter's library may be readable by root only), so load it now.
import warnings  # noqa: F401

LOCK = "attempt.lock"
PID = "pid.json"
EXIT = "exit.json"
ABANDONED = "abandoned"
OUTPUT_LOG = "output.log"
STDERR_LOG = "stderr.log"
DRAIN_AFTER_EXIT = 2.0  # seconds to keep reading pipes that escaped processes hold open


def write_json_atomic(directory: str, name: str, data: dict) -> None:
    """Write-then-rename, for readers that may look at any moment; not made durable."""
    tmp = os.path.join(directory, f".{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, json.dumps(data).encode())
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(directory, name))


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


def _exec_child(req: dict, out_w: int, err_w: int, go_r: int) -> None:
    """In the forked child: become the job. Never returns."""
    try:
        os.setpgid(0, 0)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE,
                    signal.SIGCHLD, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.read(go_r, 1)  # EOF once the shim has recorded our pid
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        if req.get("uid") is not None and req["uid"] != os.getuid():
            os.setgroups(req.get("groups") or [req["gid"]])
            os.setgid(req["gid"])
            os.setuid(req["uid"])
        try:
            os.chdir(req["cwd"])
        except OSError as exc:
            os.write(2, f"noduslocal: cannot enter workdir {req['cwd']}: {exc.strerror}\n"
                     .encode())
            os._exit(126)
        os.closerange(3, 65536)
        argv = req["argv"]
        try:
            os.execvpe(argv[0], argv, req["env"])
        except OSError as exc:
            os.write(2, f"noduslocal: cannot execute {argv[0]!r}: {exc.strerror}\n".encode())
            os._exit(127 if exc.errno == 2 else 126)
    except BaseException as exc:  # never fall back into the shim's code
        try:
            os.write(2, f"noduslocal: job setup failed: {exc}\n".encode())
        finally:
            os._exit(126)


def _pump(out_r: int, err_r: int, directory: str, pid: int) -> int:
    """Copy output into the logs until the job exits and its pipes close; return the
    wait status."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    combined = os.open(os.path.join(directory, OUTPUT_LOG), flags, 0o640)
    errors = os.open(os.path.join(directory, STDERR_LOG), flags, 0o640)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ, (combined,))
    sel.register(err_r, selectors.EVENT_READ, (combined, errors))
    sel.register(wake_r, selectors.EVENT_READ, None)
    status: int | None = None
    deadline: float | None = None
    open_pipes = 2
    while open_pipes:
        # Checked before every wait, after the SIGCHLD wake-up is in place: a job that
        # exited before we got here, leaving a child that holds its pipes, is not missed.
        if status is None:
            done, wstatus = os.waitpid(pid, os.WNOHANG)
            if done:
                status = wstatus
                # Like a container: when the main process ends, the rest of its group goes.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
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
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fd)
                os.close(key.fd)
                open_pipes -= 1
                continue
            for fd in key.data:
                os.write(fd, chunk)
    if status is None:
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    os.close(combined)
    os.close(errors)
    return status


def run_shim(req: dict) -> None:
    """In the forked shim: run one attempt to its end. Never returns."""
    code = 0
    try:
        os.setsid()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
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
        # exit.json exists, empty, from the start; its directory entry is made durable while
        # the job runs, so recording the end costs one fdatasync, not a rename and two syncs.
        exit_fd = os.open(os.path.join(directory, EXIT),
                          os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        started = time.time()
        pid = os.fork()
        if pid == 0:
            os.close(out_r)
            os.close(err_r)
            os.close(go_w)
            _exec_child(req, out_w, err_w, go_r)
        # Also done by the child; here too so the group exists before pid.json names it.
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        os.close(out_w)
        os.close(err_w)
        os.close(go_r)
        write_json_atomic(directory, PID, {"shim_pid": os.getpid(), "pid": pid, "pgid": pid,
                                           "started_at": started, "boot_id": boot_id(),
                                           "start_ticks": start_ticks(pid)})
        os.close(go_w)
        fsync_dir(directory)
        status = _pump(out_r, err_r, directory, pid)
        result: dict = {"started_at": started, "ended_at": time.time(), "exit_code": None,
                        "signal": None}
        if os.WIFSIGNALED(status):
            result["signal"] = os.WTERMSIG(status)
            result["exit_code"] = 128 + result["signal"]
        else:
            result["exit_code"] = os.waitstatus_to_exitcode(status)
        # One write of a few dozen bytes into an empty file: after a crash the file is
        # either empty (no exit recorded) or whole.
        os.write(exit_fd, json.dumps(result).encode())
        os.fdatasync(exit_fd)
        os.close(exit_fd)
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
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        req = json.loads(line)
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


if __name__ == "__main__":
    serve()
