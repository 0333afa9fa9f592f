"""What the daemon says to systemd and takes from it: sd_notify messages (READY, STATUS,
STOPPING and the watchdog's keep-alives) and a listening socket passed by socket activation
(LISTEN_FDS). Each is nothing when systemd did not start us. Stdlib only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

log = logging.getLogger("noduslocald")
LISTEN_FDS_START = 3  # SD_LISTEN_FDS_START: the first descriptor systemd passes


class ActivationError(RuntimeError):
    """What systemd passed is not one listening Unix stream socket."""


def notify(message: str) -> bool:
    """Send MESSAGE (`READY=1`, `STATUS=...`) to systemd's notify socket, when there is one;
    whether it was sent. A manager that stopped listening never stops the daemon."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("could not tell systemd %r at %s: %s", message.split("\n")[0],
                    os.environ.get("NOTIFY_SOCKET"), exc)
        return False
    return True


def passed_socket() -> socket.socket | None:
    """The listening socket systemd passed (socket activation), or None. The LISTEN_*
    variables are removed, so no job or shim the daemon starts takes them for its own."""
    count = os.environ.pop("LISTEN_FDS", None)
    pid = os.environ.pop("LISTEN_PID", None)
    os.environ.pop("LISTEN_FDNAMES", None)
    if not count or pid != str(os.getpid()):
        return None
    if count != "1":
        raise ActivationError(f"systemd passed {count} sockets; noduslocal.socket must "
                              "have exactly one ListenStream=")
    os.set_inheritable(LISTEN_FDS_START, False)
    sock = socket.socket(fileno=LISTEN_FDS_START)
    listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM or not listening:
        sock.detach()
        raise ActivationError("systemd passed a socket that is not a listening Unix stream "
                              "socket; use ListenStream=/run/noduslocal/api.sock")
    return sock


def watchdog_interval() -> float | None:
    """Seconds between keep-alives systemd asks for (half its WatchdogSec), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1e6 / 2


async def keep_alive(interval: float) -> None:
    """WATCHDOG=1 every INTERVAL from the event loop itself: a loop stuck in a blocking call
    misses them, and systemd restarts the daemon (the jobs run on, and are adopted)."""
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
