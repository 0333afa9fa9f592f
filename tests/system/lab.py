"""The shared workstation of the multi-user tests: two real Unix users in the socket group,
a copy of the package they can import with Debian's python3, and a daemon run by root.
Needs root; skipped otherwise, except under CI, where a missing prerequisite fails."""

from __future__ import annotations

import contextlib
import grp
import importlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pathspec
import pytest

import noduslocal
from noduslocal import testing
from noduslocal.domain.sockets import SOCKET_ENV

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
SOCKET_GROUP = "noduslocal"
ADMIN_GROUP = "noduslocal-admin"
ALICE = "nlalice"
BOB = "nlbob"
DEADLINE = 60.0  # seconds; generous, only to keep a broken daemon from hanging the run


# Raw HTTP over the daemon's socket with the standard library only, for a second user:
# argv = SOCKET METHOD PATH BODY-JSON-OR-EMPTY HEADERS-JSON; prints {"status", "body"}.
RAW_HTTP = '''\
import http.client, json, socket, sys


class Conn(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=60)
        self.unix_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(60)
        sock.connect(self.unix_path)
        self.sock = sock


path, method, url, body, headers = sys.argv[1:6]
conn = Conn(path)
hdrs = json.loads(headers)
if body:
    hdrs.setdefault("Content-Type", "application/json")
conn.request(method, url, body=body.encode() if body else None, headers=hdrs)
resp = conn.getresponse()
data = resp.read().decode()
try:
    decoded = json.loads(data) if data else None
except ValueError:
    decoded = data
print(json.dumps({"status": resp.status, "body": decoded}))
'''


def unavailable(reason: str) -> None:
    """Skip on a developer box; under CI a missing prerequisite is a failure."""
    if os.environ.get("CI"):
        pytest.fail(f"multi-user tests cannot run under CI: {reason}")
    pytest.skip(reason)


def run(*argv: str, check: bool = True, timeout: float = DEADLINE,
         ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n"
                             f"{result.stdout}{result.stderr}")
    return result


def group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def open_up(root: Path) -> None:
    """Directories 0755, files 0644: readable by every user, writable by root only."""
    os.chmod(root, 0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(Path(dirpath) / name, 0o755)
        for name in filenames:
            os.chmod(Path(dirpath) / name, 0o644)


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: str


# aiohttp and what it imports, for the users' `noduslocal dashboard` (their interpreter is
# the system's, which has none of the venv's packages).
DASHBOARD_PACKAGES = ("aiohttp", "multidict", "yarl", "frozenlist", "aiosignal", "attr",
                      "attrs", "propcache", "aiohappyeyeballs", "idna", "typing_extensions")


@dataclass
class Box:
    """The shared workstation: one daemon, two users and a library they can import."""

    daemon: testing.Daemon
    lib: Path
    alice: User
    bob: User

    def users(self) -> list[User]:
        return [self.alice, self.bob]

    def user(self, name: str) -> User:
        return next(u for u in self.users() if u.name == name)

    def as_user(self, user: str, *argv: str, timeout: float = DEADLINE,
                socket: Path | None = None,
                input: str | None = None) -> subprocess.CompletedProcess[str]:
        """ARGV as USER, with a clean environment and cwd in the library copy (so that the
        checkout in /work/main, which others can read too, is never imported by accident)."""
        return subprocess.run(self.argv_as(user, *argv, socket=socket), capture_output=True,
                              text=True, timeout=timeout, cwd=self.lib, input=input)

    def argv_as(self, user: str, *argv: str, socket: Path | None = None) -> list[str]:
        """The command line that runs ARGV as USER as as_user() does (run it in self.lib)."""
        home = "/root" if user == "root" else self.user(user).home
        env = ["PATH=/usr/local/bin:/usr/bin:/bin", f"HOME={home}", "LANG=C.UTF-8",
               f"{SOCKET_ENV}={socket or self.daemon.socket}", f"PYTHONPATH={self.lib}",
               "PYTHONDONTWRITEBYTECODE=1"]
        return ["runuser", "-u", user, "--", "env", "-i", *env, *argv]

    def cli(self, user: str, *args: str, timeout: float = DEADLINE,
            socket: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`noduslocal ARGS...` as USER (root runs the checkout with the test interpreter)."""
        if user == "root":
            env = {**os.environ, SOCKET_ENV: str(socket or self.daemon.socket)}
            return subprocess.run([sys.executable, "-m", "noduslocal.cli", *args],
                                  capture_output=True, text=True, timeout=timeout, env=env,
                                  cwd=REPO)
        return self.as_user(user, SYSTEM_PYTHON, "-m", "noduslocal.cli", *args,
                            timeout=timeout, socket=socket)

    def cli_json(self, user: str, *args: str, socket: Path | None = None) -> Any:
        result = self.cli(user, *args, socket=socket)
        assert result.returncode == 0, f"{user}: noduslocal {' '.join(args)}:\n{result.stderr}"
        return json.loads(result.stdout)

    def raw(self, user: str, method: str, path: str, body: Any = None,
            headers: dict[str, str] | None = None,
            socket: Path | None = None) -> tuple[int, Any]:
        """One HTTP request as USER with nothing but the standard library."""
        result = self.as_user(
            user, SYSTEM_PYTHON, str(self.lib / "nl_raw.py"),
            str(socket or self.daemon.socket), method, path,
            "" if body is None else json.dumps(body), json.dumps(headers or {}))
        assert result.returncode == 0, result.stderr
        reply = json.loads(result.stdout)
        return reply["status"], reply["body"]



@contextlib.contextmanager
def open_box(config: str | None = None, names: tuple[str, str] = (ALICE, BOB),
             keep_group: bool = False) -> Iterator[Box]:
    """Two users (NAMES, nlalice and nlbob by default) in the socket group, a library they
    can import and a daemon run by root (with CONFIG): removed again at the end, the
    socket group too unless KEEP_GROUP (a box beside another, in a process of its own,
    must not take the group from under the other's users)."""
    if os.geteuid() != 0:
        unavailable("needs root: creates Unix users and runs commands as them")
    for tool in ("groupadd", "groupdel", "useradd", "userdel", "usermod", "gpasswd",
                 "runuser"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        unavailable(f"{SYSTEM_PYTHON} (an interpreter other users can run) is missing")

    made_socket_group = not group_exists(SOCKET_GROUP)
    run("groupadd", "-f", SOCKET_GROUP)
    users: list[User] = []
    lib = Path(tempfile.mkdtemp(prefix="nl-lib-", dir="/tmp"))
    daemon: testing.Daemon | None = None
    try:
        for name in names:
            if user_exists(name):  # left over from an interrupted run: start afresh
                run("userdel", "-r", name, check=False)
            if user_exists(name):
                run("usermod", "-G", SOCKET_GROUP, name)  # replaces every other group
            else:
                run("useradd", "-m", "-G", SOCKET_GROUP, name)
            entry = pwd.getpwnam(name)
            users.append(User(name, entry.pw_uid, entry.pw_gid, entry.pw_dir))

        copy_tree(Path(noduslocal.__file__).parent, lib / "noduslocal")
        copy_tree(Path(click.__file__).parent, lib / "click")
        copy_tree(Path(pathspec.__file__).parent, lib / "pathspec")  # for --upload
        for package in DASHBOARD_PACKAGES:  # `noduslocal dashboard` runs on aiohttp
            found = Path(importlib.import_module(package).__file__ or "")
            if found.name == "__init__.py":
                copy_tree(found.parent, lib / package)
            else:
                shutil.copy(found, lib / found.name)
        (lib / "nl_raw.py").write_text(RAW_HTTP)
        open_up(lib)
        probe = run("runuser", "-u", names[1], "--", "env", "-i", f"PYTHONPATH={lib}",
                    SYSTEM_PYTHON, "-c", "import noduslocal.cli.main", check=False)
        if probe.returncode != 0:
            raise AssertionError(f"{names[1]} cannot import the CLI from {lib}:\n"
                                 f"{probe.stderr}")

        daemon = testing.Daemon(cpus=4, memory="8GiB", config=config)
        daemon.start()
        yield Box(daemon, lib, users[0], users[1])
    finally:
        if daemon is not None:
            daemon.close()
        shutil.rmtree(lib, ignore_errors=True)
        for user in users:
            with contextlib.suppress(Exception):
                run("userdel", "-r", user.name, check=False)
        if made_socket_group and not keep_group:
            with contextlib.suppress(Exception):
                run("groupdel", SOCKET_GROUP, check=False)
