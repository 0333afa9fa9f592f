"""Where the daemon's socket is: the override (NODUSLOCAL_SOCKET), a user's own daemon's,
the system one's. Stdlib `os` only, and paths as strings: every client call reads this, and
pathlib alone would cost it more than the rest of its imports.
"""

from __future__ import annotations

import os

SYSTEM_SOCKET = "/run/noduslocal/api.sock"
SOCKET_ENV = "NODUSLOCAL_SOCKET"


def user_socket_path(uid: int | None = None) -> str:
    uid = os.getuid() if uid is None else uid
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "noduslocal", "api.sock")
    return f"/tmp/noduslocal-{uid}/api.sock"


def default_socket_path() -> str:
    """Where a daemon started by this user listens."""
    if env := os.environ.get(SOCKET_ENV):
        return env
    return SYSTEM_SOCKET if os.getuid() == 0 else user_socket_path()


def client_socket_candidates() -> list[str]:
    """Where a client looks, in order: the override, the user's own daemon, the system one."""
    if env := os.environ.get(SOCKET_ENV):
        return [env]
    if os.getuid() == 0:
        return [SYSTEM_SOCKET]
    return [user_socket_path(), SYSTEM_SOCKET]
