"""The client's asyncio side: aiohttp over the daemon's Unix socket, each connection checked
to be served by root or by us, for what the blocking wire client does not speak (the
dashboard's server, `job exec -it`'s WebSocket). Imported only by those.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import aiohttp

from noduslocal.domain import errors


class TrustedConnector(aiohttp.UnixConnector):
    """Each connection checked to be served by root or by us (as the CLI checks): another
    user's process on a path we would trust must never be believed, nor told what we ask."""

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        conn = await super().connect(req, traces, timeout)
        transport = conn.transport
        sock = None if transport is None else transport.get_extra_info("socket")
        uid = None
        if sock is not None:
            cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)  # pid, uid, gid
            uid = int.from_bytes(cred[4:8], sys.byteorder, signed=True)
        if uid not in (0, os.getuid()):
            conn.close()
            raise errors.PermissionDenied(f"{self.path} is served by uid {uid}, neither root "
                                          "nor you; refusing it")
        return conn
