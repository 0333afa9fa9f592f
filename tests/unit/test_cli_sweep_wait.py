"""`noduslocal sweep wait` into a pipe: one long poll at a time, not one a second."""

from __future__ import annotations

from typing import Any

import pytest

from noduslocal.cli import sweep_actions
from noduslocal.domain import errors


class Recording:
    """Answers as a daemon would, and keeps what was asked (the client's interface)."""

    def __init__(self, phases: list[str], timeout_after: float | None = None) -> None:
        self.phases = phases
        self.timeout_after = timeout_after
        self.calls: list[tuple[str, float | None]] = []

    def _doc(self) -> dict[str, Any]:
        phase = self.phases.pop(0) if len(self.phases) > 1 else self.phases[0]
        return {"name": "s", "phase": phase, "cells": 4, "done": 0}

    def get_sweep(self, name: str, project: str | None = None) -> dict[str, Any]:
        self.calls.append(("get", None))
        return self._doc()

    def wait_sweep(self, name: str, project: str | None = None,
                   timeout: float | None = None) -> dict[str, Any]:
        self.calls.append(("wait", timeout))
        if self.timeout_after is not None:
            raise errors.WaitTimeout(f"sweep {name!r} is still Running after "
                                     f"{self.timeout_after:g}s")
        return self._doc()


def test_without_a_bar_it_waits_in_one_long_poll() -> None:
    client = Recording(["Running", "Succeeded"])
    doc = sweep_actions.wait_with_progress(client, "s", None, None, quiet=True)  # type: ignore[arg-type]
    assert doc["phase"] == "Succeeded"
    # Before: a status every second ("wait" with timeout 1.0) until the end.
    assert client.calls == [("get", None), ("wait", None)]


def test_without_a_bar_a_timeout_is_the_polls_deadline() -> None:
    client = Recording(["Running"], timeout_after=5)
    with pytest.raises(errors.WaitTimeout, match="still Running after 5s"):
        sweep_actions.wait_with_progress(client, "s", None, 5.0, quiet=True)  # type: ignore[arg-type]
    (kind, asked), = client.calls[1:]
    assert kind == "wait" and asked is not None and 4.0 < asked <= 5.0


def test_an_ended_sweep_is_answered_by_one_read() -> None:
    client = Recording(["Failed"])
    doc = sweep_actions.wait_with_progress(client, "s", None, None, quiet=True)  # type: ignore[arg-type]
    assert doc["phase"] == "Failed"
    assert client.calls == [("get", None)]
