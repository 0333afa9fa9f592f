"""The unit tier runs in one process: no daemon, no job, no other program. A test here that
starts a process fails, so the tier stays what `scripts/test.sh unit` promises (seconds)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def no_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refused(self: subprocess.Popen[bytes], args: object, *rest: object) -> None:
        raise AssertionError(f"a unit test started a process ({args!r}): it belongs in "
                             "tests/daemon or tests/system")

    # Every subprocess.run, Popen and asyncio subprocess goes through this.
    monkeypatch.setattr(subprocess.Popen, "_execute_child", refused)
    yield
