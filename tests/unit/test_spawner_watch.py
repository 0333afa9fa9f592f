"""The host spawner's watch of a shim by its pidfd (runtime/host/spawner.py): a shim whose
pid names another process by the time it is watched. No shim runs: the "other process" is
this test's own, whose pidfd never becomes readable while the test runs."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from noduslocal.daemon.runtime import shim
from noduslocal.daemon.runtime.base import Exited
from noduslocal.daemon.runtime.host import spawner


def test_a_shim_gone_before_its_watch_is_seen_by_its_exit_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch opens a pidfd on the pid the spawner answered; if the shim had exited by
    then and its pid names another process, that pidfd stays quiet. The shim records its
    exit before it exits, so a record found by the check REUSE_CHECK later ends the watch
    with it (the check no longer costs every launch a stat, issue 25 part 5)."""
    monkeypatch.setattr(spawner, "REUSE_CHECK", 0.05)
    (tmp_path / shim.EXIT).write_text(json.dumps(
        {"started_at": 1.0, "ended_at": 2.0, "exit_code": 3, "signal": None}))

    async def watched() -> object:
        return await asyncio.wait_for(
            spawner.Spawner().watch(tmp_path, os.getpid()), 5)

    state = asyncio.run(watched())
    assert isinstance(state, Exited) and state.exit_code == 3


def test_a_live_shim_is_not_taken_for_gone(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """No exit record at the check: the pid is still the shim's, and the watch waits."""
    monkeypatch.setattr(spawner, "REUSE_CHECK", 0.05)

    async def watched() -> bool:
        future = spawner.Spawner().watch(tmp_path, os.getpid())
        await asyncio.sleep(0.3)
        done = future.done()
        future.cancel()
        return done

    assert asyncio.run(watched()) is False
