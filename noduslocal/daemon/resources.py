"""The API's door to what users own besides jobs: their secrets (values go in, never out),
named volumes (a row and a directory made with the owner's rights) and uploaded sources
(blobs named by sha256, hashed as they arrive, also made from a finished job's workspace).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from noduslocal.daemon.disk.room import Room
from noduslocal.daemon.disk.usage import DiskUsage
from noduslocal.daemon.files import snapshot
from noduslocal.daemon.files.blobs import HashingWriter
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.store import Store, resources
from noduslocal.domain import errors
from noduslocal.domain.jobs import JobRecord, Owner

log = logging.getLogger(__name__)


def discard(directory: Path) -> None:
    """Move a directory out of the way at once, then delete it (shutil.rmtree is fd-based,
    so safe against links; a tree too deep for it stays behind, renamed, and is logged)."""
    trash = directory.with_name(f".trash-{directory.name}-{os.urandom(4).hex()}")
    os.rename(directory, trash)
    try:
        shutil.rmtree(trash)
    except (OSError, RecursionError):
        log.exception("could not delete %s", trash)


class ResourceService:
    def __init__(self, store: Store, layout: JobLayout, room: Room, usage: DiskUsage) -> None:
        self.store = store
        self.layout = layout
        self.room = room
        self.usage = usage

    # --- secrets --------------------------------------------------------------------------

    async def secrets(self, uid: int) -> list[tuple[str, float, float]]:
        """(name, created, updated) of the user's secrets; never their values."""
        return await self.store.secrets(uid)

    async def set_secret(self, uid: int, name: str, value: str) -> bool:
        """True when it is new."""
        created: bool = await self.store.write(
            lambda c: resources.set_secret(c, uid, name, value, time.time()))
        return created

    async def delete_secret(self, uid: int, name: str) -> None:
        await self.store.write(lambda c: resources.delete_secret(c, uid, name))

    # --- volumes --------------------------------------------------------------------------

    async def volumes(self, name: str | None = None) -> list[dict[str, Any]]:
        return await self.store.volumes(name)

    async def create_volume(self, name: str, owner: Owner, gid: int) -> None:
        self.room.require("new volumes", owner.uid, owner.name)
        # The row first: its unique key decides between two creates of one name, and only
        # the winner touches the directory.
        await self.store.write(lambda c: resources.create_volume(c, name, owner, time.time()))
        directory = self.layout.volume_dir(name)
        try:
            if directory.exists():  # left by a crash or a failed removal: the name is ours
                await asyncio.to_thread(discard, directory)
            directory.mkdir(mode=0o700)
            if os.getuid() == 0:
                os.chown(directory, owner.uid, gid)
        except Exception:
            await self.store.write(lambda c: resources.delete_volume(c, name))
            raise

    async def delete_volume(self, name: str) -> None:
        await self.store.write(lambda c: resources.delete_volume(c, name))
        directory = self.layout.volume_dir(name)
        if directory.exists():
            await asyncio.to_thread(discard, directory)
        self.usage.refresh_soon()

    def volume_dir(self, name: str) -> Path:
        return self.layout.volume_dir(name)

    # --- sources --------------------------------------------------------------------------

    async def touch_source(self, sha: str, uid: int) -> int | None:
        """The size of the user's upload of that digest (its age starts again); None when
        they have none."""
        now = time.time()
        size: int | None = await self.store.write(
            lambda c: resources.touch_source(c, sha, uid, now))
        return size

    def require_upload_room(self, owner: Owner) -> None:
        """Refused when the disk is below its reserve or the owner over their quota."""
        self.room.require("uploads", owner.uid, owner.name)

    async def upload_source(self, sha: str, owner: Owner, chunks: AsyncIterator[bytes],
                            limit: int) -> int:
        """Store an upload as the blob `sha`, checked against its digest; its size."""
        self.require_upload_room(owner)
        blobs = self.layout.blobs
        fd, tmp = blobs.new()
        writer = HashingWriter(fd)
        kept = False
        try:
            async for chunk in chunks:
                if writer.size + len(chunk) > limit:
                    raise errors.PayloadTooLarge(
                        f"source: more than {limit // 2**20} MiB; pass allow_large_source=True "
                        "for a larger one", field="source")
                await asyncio.to_thread(writer.write, chunk)  # disk writes off the loop
            if writer.digest.hexdigest() != sha:
                raise errors.InvalidArgument(f"sha256: the upload hashes to "
                                             f"{writer.digest.hexdigest()}, not {sha}",
                                             field="sha256")
            size, _ = await asyncio.to_thread(blobs.keep, tmp, writer)
            kept = True
        finally:
            if not kept:
                os.close(fd)
                tmp.unlink(missing_ok=True)
        await blobs.recorded(self.store.write(
            lambda c: resources.record_source(c, sha, owner.uid, size, time.time())), [sha])
        return size

    async def snapshot(self, job: JobRecord, workspace: Path, owner: Owner,
                       limit: int) -> tuple[str, int]:
        """A finished job's workspace packed as a source of `owner`'s: (sha256, size)."""
        self.require_upload_room(owner)
        sha, size = await asyncio.to_thread(snapshot.pack, workspace, job, self.layout.blobs,
                                            limit)
        await self.layout.blobs.recorded(self.store.write(
            lambda c: resources.record_source(c, sha, owner.uid, size, time.time())), [sha])
        return sha, size
