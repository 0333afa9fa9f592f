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


def test_watches_share_one_timer_for_the_check(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """One timer looks at every watch due, not one timer a watch (a map of `true` paid
    for its own with every task); each watch is looked at once."""
    monkeypatch.setattr(spawner, "REUSE_CHECK", 0.05)
    gone, live = tmp_path / "gone", tmp_path / "live"
    for directory in (gone, live):
        directory.mkdir()
    (gone / shim.EXIT).write_text(json.dumps(
        {"started_at": 1.0, "ended_at": 2.0, "exit_code": 0, "signal": None}))

    async def watched() -> tuple[object, bool, int]:
        runtime = spawner.Spawner()
        first = runtime.watch(gone, os.getpid())
        check = runtime._reuse_checks._timer
        second = runtime.watch(live, os.getpid())
        assert check is not None and runtime._reuse_checks._timer is check
        state = await asyncio.wait_for(first, 5)
        await asyncio.sleep(0.3)
        left = len(runtime._reuse_checks._due)
        done = second.done()
        second.cancel()
        await runtime.close()
        return state, done, left

    state, done, left = asyncio.run(watched())
    assert isinstance(state, Exited) and state.exit_code == 0
    assert not done and left == 0
