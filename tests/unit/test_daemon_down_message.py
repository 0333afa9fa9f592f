"""Issue 28: when no daemon answers, a lab user on an installed box is sent to the shared
daemon's service and its admin, not told to start a private daemon without the box's GPUs."""

from __future__ import annotations

import grp
import os
import pwd
import socket
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


@pytest.mark.skipif(os.geteuid() != 0, reason="the socket's group is set with chown, as root")
def test_a_refused_socket_says_what_would_let_the_caller_in(tmp_path: Path) -> None:
    """EACCES on the socket (review of bce9d3e): never "join root"; a member is told that
    the mode or a security module refuses them, a non-member which group to join."""
    sock = socket.socket(socket.AF_UNIX)
    path = tmp_path / "api.sock"
    sock.bind(str(path))
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
        os.chown(path, 0, 0)
        assert transport.not_let_in(str(path), nobody, []).endswith(
            "ask this daemon's admin: its socket is root's alone (no socket group)")
        group = grp.getgrnam("daemon")  # a Debian group nobody is not in
        os.chown(path, 0, group.gr_gid)
        assert transport.not_let_in(str(path), nobody, []).endswith(
            "the members of the group daemon; ask its admin to add you (usermod -aG daemon "
            "nobody), then log in again")
        assert transport.not_let_in(str(path), nobody, [group.gr_gid]).endswith(
            "you are in its group daemon, yet the socket's mode or a security module "
            "refuses you")
    finally:
        sock.close()
