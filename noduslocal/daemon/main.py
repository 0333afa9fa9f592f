"""noduslocald: open the store, start the runtime, reconcile, serve the API on the Unix
socket, tell systemd we are ready, and on SIGTERM/SIGINT stop taking work and exit cleanly
while the jobs run on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import functools
import gc
import grp
import logging
import os
import signal
import socket
import stat
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

from noduslocal.daemon import logfmt, systemd
from noduslocal.daemon.config.reload import ConfigReloader
from noduslocal.daemon.config.settings import Settings, default_config_path, load_settings
from noduslocal.domain import errors

log = logging.getLogger("noduslocald")
IDENTITY_TTL = 60.0  # seconds a user's admin membership is cached
SHUTDOWN_TIMEOUT = 1.5  # seconds open streams get before the socket closes under them
GC_THRESHOLD = 20_000  # allocations between collections of the youngest generation


class StartupError(RuntimeError):
    pass


def check_private(path: Path, what: str) -> None:
    """Root mode: every existing directory on the way to `path` must be root's and writable
    by nobody else (unless sticky, like /tmp), or another user could swap in a link and
    have the daemon's shims write, as root, wherever it points."""
    for part in [path, *path.parents]:
        try:
            info = part.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            info = part.stat()
        if info.st_uid != 0 or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
            raise StartupError(f"{what} {path} is not safe for a root daemon: {part} is owned "
                               f"by uid {info.st_uid} or writable by others")


def claim_socket(path: Path, user_mode: bool) -> None:
    """Refuse to start when a live daemon answers; a stale socket is replaced later."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700 if user_mode else 0o755)
    if user_mode:
        info = path.parent.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise StartupError(f"{path.parent} must be yours with mode 0700 to hold your "
                               "socket; another user may have made it")
    else:
        check_private(path.parent, "the socket directory")
    if not path.exists() and not path.is_symlink():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return  # stale: bind_socket renames the new socket over it
    except TimeoutError:
        pass
    finally:
        probe.close()
    raise StartupError(f"another noduslocald is already serving on {path}")


def lock_data_dir(data_dir: Path, user_mode: bool) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    if not user_mode:
        check_private(data_dir, "the data directory")
    os.chmod(data_dir, 0o700 if user_mode else 0o711)
    fd = os.open(data_dir / "daemon.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StartupError(f"another noduslocald is using the data directory {data_dir}")\
            from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def bind_socket(settings: Settings, backlog: int) -> socket.socket:
    """Listen on a temporary name with the final mode, then rename it over the socket path:
    clients never see the path missing or open to the wrong users while we restart."""
    path = settings.socket
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(str(tmp))
        secure_socket(settings, tmp)
        sock.listen(backlog)
        os.rename(tmp, path)
    except BaseException:
        sock.close()
        tmp.unlink(missing_ok=True)
        raise
    return sock


def secure_socket(settings: Settings, path: Path) -> None:
    if settings.user_mode:
        os.chmod(path, 0o600)
        return
    os.chmod(path, 0o660)
    try:
        os.chown(path, 0, grp.getgrnam(settings.socket_group).gr_gid)
    except KeyError:
        log.warning("group %r does not exist, so only root can reach %s; create it with "
                    "`groupadd %s` and add users to it", settings.socket_group,
                    settings.socket, settings.socket_group)


async def refresh_identities() -> None:
    """Forget cached user names and admin membership now and then, so a user removed from
    the admin group loses the rights within a minute, without a restart."""
    from noduslocal.daemon.accounts import account
    from noduslocal.daemon.api import identity

    while True:
        await asyncio.sleep(IDENTITY_TTL)
        identity.clear_caches()
        account.cache_clear()


def dump_state(lines: list[str]) -> None:
    """The daemon's state and every task of its loop, where each waits, in one record of
    its log (`kill -USR1 PID`): what is stuck, and on what, without stopping anything."""
    tasks = []
    for task in asyncio.all_tasks():
        frames = []
        awaited: Any = task.get_coro()
        while awaited is not None and len(frames) < 16:  # down the chain of awaits
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                frames.append(type(awaited).__name__)  # a future, or a C-level awaitable
                break
            frames.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} "
                          f"{frame.f_code.co_name}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        tasks.append(f"  task {task.get_name()}: {' > '.join(frames) or '-'}")
    log.warning("state dump (SIGUSR1)\n%s\n%d tasks:\n%s\nend of state dump",
                "\n".join(lines), len(tasks), "\n".join(sorted(tasks)))


async def serve(settings: Settings, ready: asyncio.Event | None = None,
                config: tuple[Path, Callable[[], Settings]] | None = None) -> None:
    """Serve until SIGTERM. CONFIG: the file the settings came from and how to load it
    again, followed while the daemon runs."""
    # Imported here so `noduslocald --help` and the CLI stay fast.
    from noduslocal.daemon.api.app import build_app
    from noduslocal.daemon.api.connections import (
        ConnectionGuard,
        GuardedSite,
        listen_backlog,
        raise_fd_limit,
        total_cap,
    )
    from noduslocal.daemon.api.prometheus import Metrics, scrape_app
    from noduslocal.daemon.build import build_daemon

    try:
        passed = systemd.passed_socket()
    except systemd.ActivationError as exc:
        raise StartupError(str(exc)) from None
    loaded = settings  # as the config file and the command line gave it
    if passed is not None:
        # Socket activation: systemd made the socket, with its mode and group, and keeps it
        # across our restarts; the path it is bound to is the one we serve.
        settings = replace(settings, socket=Path(passed.getsockname()))
    else:
        claim_socket(settings.socket, settings.user_mode)
    systemd.notify("STATUS=opening the database")
    fd_limit = raise_fd_limit(settings.max_open_files)
    lock_fd = lock_data_dir(settings.data_dir, settings.user_mode)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    daemon = await build_daemon(settings)
    runner: web.AppRunner | None = None
    scraper: web.AppRunner | None = None
    try:
        systemd.notify("STATUS=recovering: adopting the jobs that ran on while no daemon was up")
        await daemon.start()
        services = daemon.services
        reloader = None
        if config is not None:
            # Every part reads the one holder: a reload is replacing what it holds.
            reloader = ConfigReloader(config[0], config[1], loaded, settings,
                                      daemon.live.replace)
            daemon.lifecycle.admin.config = reloader
        metrics = Metrics(services)
        app = build_app(services, metrics)
        # A connection that never finishes its request's headers is closed like an idle one.
        handler_options = {"access_log": None, "keepalive_timeout": settings.idle_timeout}
        runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_TIMEOUT, **handler_options)
        await runner.setup()
        assert runner.server is not None
        guard = ConnectionGuard(runner.server, settings.user_max_connections,
                                total_cap(fd_limit), handler_options)
        backlog = listen_backlog(fd_limit)
        if passed is not None:
            passed.listen(backlog)  # systemd's Backlog= may be smaller than ours
        listening = passed if passed is not None else bind_socket(settings, backlog)
        await GuardedSite(runner, listening, guard, backlog).start()
        if settings.metrics_port is not None:
            scraper = web.AppRunner(scrape_app(metrics), access_log=None)
            await scraper.setup()
            await web.TCPSite(scraper, "127.0.0.1", settings.metrics_port).start()
            log.info("/metrics also on http://127.0.0.1:%d/metrics", settings.metrics_port)
        log.info("noduslocald %d serving on %s (data %s, %g CPUs, %d MiB)", os.getpid(),
                 settings.socket, settings.data_dir, settings.cpus_m / 1000,
                 settings.memory // 2**20)
        # What startup made lives as long as the daemon: out of the collector's sight, and
        # young objects collected less often (a collection per 700 allocations cost about
        # 3 % of the loop's time under a stream of short jobs).
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, 20, 20)
        systemd.notify(f"READY=1\nSTATUS=serving on {settings.socket}")
        if ready is not None:
            ready.set()
        background = [asyncio.create_task(refresh_identities())]
        if reloader is not None:
            background.append(asyncio.create_task(reloader.run()))
            loop.add_signal_handler(signal.SIGHUP, reloader.request)
        loop.add_signal_handler(signal.SIGUSR1,
                                lambda: dump_state(daemon.lifecycle.describe()))
        if (interval := systemd.watchdog_interval()) is not None:
            background.append(asyncio.create_task(systemd.keep_alive(interval)))
        await stop.wait()
        for task in background:
            task.cancel()
        log.info("stopping: jobs keep running and will be adopted on the next start")
        systemd.notify("STOPPING=1\nSTATUS=stopping; the jobs run on")
    finally:
        await daemon.stop()
        if runner is not None:
            await runner.cleanup()
        if scraper is not None:
            await scraper.cleanup()
        if passed is None:  # systemd's own socket stays for the next start
            with contextlib.suppress(FileNotFoundError):
                settings.socket.unlink()
        await daemon.close()
        os.close(lock_fd)


def run(settings: Settings, config: tuple[Path, Callable[[], Settings]] | None = None) -> int:
    try:
        asyncio.run(serve(settings, config=config))
    except StartupError as exc:
        log.error("%s", exc)
        return 1
    except Exception as exc:  # one line for people; the traceback for --log-level DEBUG
        log.debug("start-up failed", exc_info=True)
        log.error("noduslocald stopped: %s: %s", type(exc).__name__, exc)
        return 1
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="noduslocald",
                                     description="The noduslocal daemon.")
    parser.add_argument("--config", type=Path, help="TOML settings file")
    parser.add_argument("--socket", type=Path, help="Unix socket to serve on")
    parser.add_argument("--data-dir", type=Path, help="where jobs and the database live")
    parser.add_argument("--cpus", help="CPUs of job requests that may run at once")
    parser.add_argument("--memory", help="memory of job requests that may run at once")
    parser.add_argument("--simulate-gpus", metavar="SPEC",
                        help='simulated GPUs for a machine without them, e.g. "4xH100-80GB,2xL4"')
    parser.add_argument("--nvml-library", metavar="PATH",
                        help="a libnvidia-ml.so.1 to load instead of the system's")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logfmt.install(args.log_level)
    # watchfiles logs every batch of file changes at INFO: the config's directory, and each
    # job's metrics file, would fill the journal.
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
    overrides = {key: value for key, value in (
        ("cpus", args.cpus), ("memory", args.memory), ("simulate_gpus", args.simulate_gpus),
        ("nvml_library", args.nvml_library)) if value is not None}
    load = functools.partial(load_settings, args.config, socket=args.socket,
                             data_dir=args.data_dir, overrides=overrides)
    try:
        settings = load()
    except errors.NodusError as exc:
        print(f"noduslocald: {exc.message}", file=sys.stderr)
        return 2
    return run(settings, (args.config or default_config_path(), load))


if __name__ == "__main__":
    sys.exit(main())
