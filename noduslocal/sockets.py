"""Where the daemon's socket is: the override (NODUSLOCAL_SOCKET), a user's own daemon's,
the system one's. Stdlib only: every client reads it, so it costs them no imports.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM_SOCKET = Path("/run/noduslocal/api.sock")
SOCKET_ENV = "NODUSLOCAL_SOCKET"


def user_socket_path(uid: int | None = None) -> Path:
    uid = os.getuid() if uid is None else uid
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "noduslocal" / "api.sock"
    return Path(f"/tmp/noduslocal-{uid}") / "api.sock"


def default_socket_path() -> Path:
    """Where a daemon started by this user listens."""
    if env := os.environ.get(SOCKET_ENV):
        return Path(env)
    return SYSTEM_SOCKET if os.getuid() == 0 else user_socket_path()


def client_socket_candidates() -> list[Path]:
    """Where a client looks, in order: the override, the user's own daemon, the system one."""
    if env := os.environ.get(SOCKET_ENV):
        return [Path(env)]
    if os.getuid() == 0:
        return [SYSTEM_SOCKET]
    return [user_socket_path(), SYSTEM_SOCKET]
