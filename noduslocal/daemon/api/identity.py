"""Who is calling: the kernel's SO_PEERCRED on the Unix socket, never anything the client
sends. Resolves the uid to a user name and decides who counts as an admin.
"""

from __future__ import annotations

import grp
import os
import socket
import struct
from dataclasses import dataclass
from functools import lru_cache

from aiohttp import web

from noduslocal.daemon.accounts import user_name
from noduslocal.domain import errors
from noduslocal.domain.jobs import Owner


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    gid: int
    name: str
    admin: bool

    @property
    def owner(self) -> Owner:
        return Owner(self.uid, self.gid, self.name, self.admin)

    def may_control(self, owner_uid: int) -> bool:
        return self.admin or self.uid == owner_uid

    def require_control(self, what: str, owner_uid: int, owner: str, action: str) -> None:
        """Only the owner or an admin may; `what` names the thing ("job 'x'")."""
        if not self.may_control(owner_uid):
            raise errors.PermissionDenied(
                f"{self.name} may not {action} {what}: it belongs to {owner}")


@lru_cache(maxsize=256)
def _is_admin(uid: int, gid: int, admin_group: str) -> bool:
    if uid == 0:
        return True
    try:
        group = grp.getgrnam(admin_group)
    except KeyError:
        return False
    if gid == group.gr_gid:
        return True
    name = user_name(uid)
    try:
        return group.gr_gid in os.getgrouplist(name, gid)
    except OSError:
        return name in group.gr_mem


def peer(request: web.Request, admin_group: str) -> Caller:
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family != socket.AF_UNIX:
        raise errors.PermissionDenied("requests are only accepted on the Unix socket")
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                        struct.calcsize("3i")))
    return Caller(pid, uid, gid, user_name(uid), _is_admin(uid, gid, admin_group))


def clear_caches() -> None:
    """Group membership can change; the daemon calls this every IDENTITY_TTL seconds."""
    user_name.cache_clear()
    _is_admin.cache_clear()
