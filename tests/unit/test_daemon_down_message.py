"""Issue 28: when no daemon answers, a lab user on an installed box is sent to the shared
daemon's service and its admin, not told to start a private daemon without the box's GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from noduslocal.domain.sockets import SYSTEM_SOCKET
from noduslocal.sdk import transport


def test_on_an_installed_box_it_points_at_the_service(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    unit = tmp_path / "noduslocal.socket"
    unit.write_text("[Socket]\n")
    monkeypatch.setattr(transport, "SHARED_UNITS", (str(unit),))
    said = transport.unavailable(["/tmp/noduslocal-1000/api.sock", SYSTEM_SOCKET]).message
    assert "systemctl status noduslocal.socket noduslocal.service" in said
    assert "ask its admin" in said and "private one" in said


def test_without_an_install_it_says_how_to_start_one(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "SHARED_UNITS", (str(tmp_path / "none"),))
    said = transport.unavailable([SYSTEM_SOCKET]).message
    assert "start one with `noduslocal daemon`" in said and "private" in said
    elsewhere = transport.unavailable(["/tmp/x/api.sock"]).message  # NODUSLOCAL_SOCKET's
    assert "systemctl" not in elsewhere
