"""Unpacking a directory output's tar on the client, safely on every Python 3.11 patch
release: tarfile's 'data' filter where the interpreter has it (3.11.4 and later), the same
checks made here member by member where it does not (Debian 12's 3.11.2)."""

from __future__ import annotations

import copy
import os
import tarfile
import warnings


def extract(tar: tarfile.TarFile, dest: str) -> None:
    """Every member of TAR under DEST, except those that would land or point outside it,
    have an absolute path or link, or are devices or FIFOs: each of those is left out
    with a warning, and the rest extracted."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter=_filtered)
    else:
        extract_checked(tar, dest)


def extract_checked(tar: tarfile.TarFile, dest: str) -> None:
    """What `extract` does on an interpreter without tarfile's filters: each member
    checked here just before it is extracted, so that links an earlier member made are
    seen as they are on disk."""
    for member in tar:
        safe = checked(member, dest)
        if safe is not None:
            tar.extract(safe, dest)


def _filtered(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    if member.name.startswith("/"):  # the filter would take it relative: we refuse it
        warnings.warn(f"left out of the download: {member.name!r} has an absolute path",
                      stacklevel=3)
        return None
    try:
        return tarfile.data_filter(member, path)  # type: ignore[attr-defined]
    except tarfile.TarError as exc:  # FilterError, on the interpreters that have it
        warnings.warn(f"left out of the download: {exc}", stacklevel=3)
        return None


class _Refused(Exception):
    pass


def checked(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """MEMBER as the 'data' filter passes it (no high mode bits, no group or other write,
    no owner taken from the archive), or None, with a warning, when it may not be
    extracted at all."""
    try:
        return _checked(member, os.path.realpath(dest))
    except _Refused as exc:
        warnings.warn(f"left out of the download: {member.name!r} {exc}", stacklevel=3)
        return None


def _inside(path: str, dest: str) -> bool:
    return os.path.commonpath([path, dest]) == dest


def _checked(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    name = member.name
    if name.startswith("/") or os.path.isabs(name):
        raise _Refused("has an absolute path")
    if not _inside(os.path.realpath(os.path.join(dest, name)), dest):
        raise _Refused("would be outside the destination")
    if member.issym() or member.islnk():
        if os.path.isabs(member.linkname):
            raise _Refused(f"is a link to an absolute path ({member.linkname})")
        # A symbolic link resolves from its own directory, a hard link from the top.
        base = os.path.dirname(os.path.join(dest, name)) if member.issym() else dest
        if not _inside(os.path.realpath(os.path.join(base, member.linkname)), dest):
            raise _Refused(f"links outside the destination ({member.linkname})")
    mode = member.mode & 0o755
    if member.isreg() or member.islnk():
        if not mode & 0o100:
            mode &= ~0o111
        mode |= 0o600
    elif member.isdir():
        mode |= 0o700  # the owner must go on writing into it
    elif not member.issym():
        raise _Refused("is a device, FIFO or other special file")
    # Extracted as whoever downloads: never chown'd to the archive's owner, even as root.
    # (TarInfo.replace is 3.11.4's, like the filter.)
    safe = copy.copy(member)
    safe.mode, safe.uid, safe.gid, safe.uname, safe.gname = (mode, os.geteuid(),
                                                             os.getegid(), "", "")
    return safe
