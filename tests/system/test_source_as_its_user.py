"""The SDK packs a source as the user who runs it (a real second Unix user, Debian's
python3): a source, or a file or directory in it, that user cannot read is refused with
the SDK's own InvalidArgument naming `source`, never a PermissionError or a part left out
unsaid. The SDK's other refusals are in tests/daemon/test_sdk_arguments.py."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pathspec
import pytest

import noduslocal

SYSTEM_PYTHON = "/usr/bin/python3"


USER = "nlsdkargs"


PACK = """
import json, sys
import noduslocal as nodus
try:
    nodus.Job.run(command=["true"], source=sys.argv[1])
except Exception as exc:
    print(json.dumps({"type": type(exc).__name__, "field": getattr(exc, "field", None),
                      "message": str(exc)}))
"""


@pytest.fixture(scope="module")
def other_user() -> Iterator[tuple[str, Path]]:
    """A Unix user who is not root, and a world-readable copy of the package to run."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("needs root to act as another user")
        pytest.skip("needs root to act as another user")
    if shutil.which("useradd") is None or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("useradd and /usr/bin/python3 are needed")
    subprocess.run(["userdel", USER], capture_output=True)
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
                   check=True, capture_output=True)
    lib = Path(tempfile.mkdtemp(prefix="nl-sdklib-", dir="/tmp"))
    try:
        for package in (noduslocal, pathspec):
            source = Path(package.__file__).parent
            shutil.copytree(source, lib / source.name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        for dirpath, _, filenames in os.walk(lib):
            os.chmod(dirpath, 0o755)
            for name in filenames:
                os.chmod(Path(dirpath) / name, 0o644)
        yield USER, lib
    finally:
        shutil.rmtree(lib, ignore_errors=True)
        with contextlib.suppress(Exception):
            subprocess.run(["userdel", USER], capture_output=True)


def pack_as(user: str, lib: Path, source: Path | str) -> dict[str, Any]:
    result = subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", "PATH=/usr/bin:/bin", "HOME=/tmp",
         f"PYTHONPATH={lib}", "PYTHONDONTWRITEBYTECODE=1", SYSTEM_PYTHON, "-c", PACK,
         str(source)], capture_output=True, text=True, timeout=60, cwd="/tmp")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_source_the_user_cannot_read(other_user: tuple[str, Path]) -> None:
    user, lib = other_user
    got = pack_as(user, lib, "/root")
    assert (got["type"], got["field"]) == ("InvalidArgument", "source"), got
    assert "/root" in got["message"] and "Permission denied" in got["message"], got


def test_a_file_or_directory_in_the_source_the_user_cannot_read(
        other_user: tuple[str, Path]) -> None:
    """Neither is left out unsaid (the walk skipped an unreadable directory): the job would
    run without them."""
    user, lib = other_user
    uid = pwd.getpwnam(user).pw_uid
    base = Path(tempfile.mkdtemp(prefix="nl-sdksrc-", dir="/tmp"))  # pytest's is root's
    try:
        base.chmod(0o755)
        for secret in ("secret.txt", "private"):
            top = base / secret.split(".")[0]
            top.mkdir()
            (top / "train.py").write_text("print('hi')\n")
            hidden = top / secret
            if secret.endswith(".txt"):
                hidden.write_text("root's")
                hidden.chmod(0o600)
            else:
                hidden.mkdir(mode=0o700)
                (hidden / "inside.txt").write_text("root's")
            os.chown(top, uid, -1)
            os.chown(top / "train.py", uid, -1)
            got = pack_as(user, lib, top)
            assert (got["type"], got["field"]) == ("InvalidArgument", "source"), got
            assert str(hidden) in got["message"], got
    finally:
        shutil.rmtree(base, ignore_errors=True)
