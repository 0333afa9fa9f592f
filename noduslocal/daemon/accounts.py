"""The accounts of the box's users as the daemon looks them up: a uid's login name, and a
job owner's home, shell and groups; cached, since each lookup reads /etc/passwd and
/etc/group (the daemon clears them with the identity caches).
"""

from __future__ import annotations

import os
import pwd
from functools import lru_cache


@lru_cache(maxsize=256)
def account(uid: int, name: str, gid: int) -> tuple[str, str, list[int]]:
    """Home, shell and groups of a job's owner; each lookup reads /etc/passwd and
    /etc/group, so they are cached (the daemon clears this with the identity caches).
    An owner without a passwd entry gets no groups but its own gid."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return "/", "/bin/sh", [gid]
    try:
        groups = os.getgrouplist(entry.pw_name, gid)
    except OSError:
        groups = [gid]
    del name  # part of the cache key: a renamed user is looked up afresh
    return entry.pw_dir, entry.pw_shell, groups


@lru_cache(maxsize=1024)
def user_name(uid: int) -> str:
    """The login name of `uid` (`uid1234` where it has none), as jobs record their owner;
    cached, and cleared with the identity caches."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"
