"""Whether the daemon may take its config file: the file, and every directory above it,
changeable by root and the daemon's own user alone. Whoever else can write the file (or
replace it) could make themselves admin at the next reload."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from noduslocal.domain.errors import InvalidArgument


def read_trusted(path: Path) -> str:
    """The text of the config at PATH, read from the file whose ownership and mode were
    checked (no window between the check and the read). FileNotFoundError as open's."""
    with open(path, "rb") as file:
        check(path, os.fstat(file.fileno()))
        return file.read().decode("utf-8")


def check(path: Path, info: os.stat_result) -> None:
    """Refuse PATH (its stat INFO) when anyone but root and this process's user could
    change it, or rename another file into its place."""
    allowed = {0, os.geteuid()}
    writer = _other_writer(info, allowed)
    if writer is not None:
        raise InvalidArgument(f"config: {path} can be changed by {writer} "
                              f"{_refusal(path, info, allowed)}", field="config")
    absolute = Path(os.path.abspath(path))
    # The directories the name goes through, and those of the file a link points at.
    for directory in sorted({*absolute.parents, *Path(os.path.realpath(absolute)).parents},
                            key=lambda d: len(d.parts), reverse=True):  # nearest first
        try:
            dir_info = os.stat(directory)
        except OSError:
            continue  # one we cannot look at is one the open above went through anyway
        writer = _other_writer(dir_info, allowed, directory=True)
        if writer is not None:
            raise InvalidArgument(
                f"config: {path} is in {directory}, which {writer} can change, and so "
                f"replace the file {_refusal(directory, dir_info, allowed)}", field="config")


def _refusal(path: Path, info: os.stat_result, allowed: set[int]) -> str:
    """Why, and the commands that make PATH safe."""
    fix = f"chmod go-w {path}"
    if info.st_uid not in allowed:
        fix = f"chown {_user(os.geteuid())} {path} && {fix}"
    return (f"(owner {_user(info.st_uid)}, mode {stat.S_IMODE(info.st_mode):04o}); the "
            f"daemon takes a config only {_allowed_words(allowed)} can change, as whoever "
            f"else can could make themselves admin: {fix}")


def _other_writer(info: os.stat_result, allowed: set[int],
                  directory: bool = False) -> str | None:
    """Who besides ALLOWED may write: its owner, its group's other members, or everyone.
    A sticky directory (/tmp) lets nobody replace what they do not own."""
    if info.st_uid not in allowed:
        return f"its owner {_user(info.st_uid)}"
    if directory and info.st_mode & stat.S_ISVTX:
        return None
    if info.st_mode & stat.S_IWOTH:
        return "every user"
    if info.st_mode & stat.S_IWGRP and not _group_only(info.st_gid, allowed):
        return f"the group {_group(info.st_gid)}"
    return None


def _group_only(gid: int, allowed: set[int]) -> bool:
    """The group's members are all ALLOWED (a user's private group, root's)."""
    try:
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return False
    names = {_user(uid) for uid in allowed}
    if members - names:
        return False
    return all(entry.pw_uid in allowed for entry in pwd.getpwall() if entry.pw_gid == gid)


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return repr(grp.getgrgid(gid).gr_name)
    except KeyError:
        return f"gid {gid}"


def _allowed_words(allowed: set[int]) -> str:
    return "root" if allowed == {0} else f"root and {_user(max(allowed))}"
