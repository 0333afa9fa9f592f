"""The SDK refuses arguments it cannot send with its own InvalidArgument naming the argument
(never json's TypeError, an AttributeError or a PermissionError from packing a source), and
creates nothing when it does. The source a user cannot read is tried as that user.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pathspec
import pytest

import noduslocal
import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors

SYSTEM_PYTHON = "/usr/bin/python3"
USER = "nlsdkargs"


def refused(call: Callable[[], Any], field: str) -> str:
    with pytest.raises(errors.InvalidArgument) as caught:
        call()
    assert caught.value.field == field, caught.value
    assert caught.value.message.startswith(f"{field}: "), caught.value.message
    return caught.value.message


@pytest.mark.parametrize("kwargs, field", [
    ({"command": ["true"], "timeout": object()}, "timeout"),
    ({"command": ["true"], "name": b"abc"}, "name"),
    ({"command": ["true"], "project": b"team"}, "project"),
    ({"command": [b"true"]}, "command"),
    ({"command": ["true"], "labels": {"a": b"x"}}, "labels"),
    ({"command": ["true"], "env": {1: "a"}}, "env"),
    ({"command": ["true"], "env": {"A": {1, 2}}}, "env"),
    ({"command": ["true"], "gpu": object()}, "gpu"),
    ({"command": ["true"], "distributed": nodus.Distributed(nodes=2,
                                                            startup_timeout=object())},
     "distributed"),
])
def test_job_arguments_json_cannot_say(daemon: testing.Daemon, kwargs: dict[str, Any],
                                       field: str) -> None:
    message = refused(lambda: nodus.Job.run(**kwargs), field)
    if isinstance(kwargs.get(field), bytes):
        assert "decode" in message
    assert daemon.client().list_jobs(all=True) == []


def test_a_bad_argument_uploads_nothing(daemon: testing.Daemon, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    refused(lambda: nodus.Job.run(command=["true"], source=tmp_path, timeout=object()),
            "timeout")
    assert not list((daemon.data_dir / "sources").glob("**/*.tar"))


def test_handles_and_waits(daemon: testing.Daemon, tmp_path: Path) -> None:
    refused(lambda: nodus.Job.from_name(b"abc"), "name")
    refused(lambda: nodus.Job.from_name(None), "name")  # type: ignore[arg-type]
    refused(lambda: nodus.Job.from_name("abc", project=5), "project")  # type: ignore[arg-type]
    job = nodus.Job.run(command=["sh", "-c", "echo hi > out.txt"], outputs={"o": "out.txt"})
    refused(lambda: job.wait(timeout="soon"), "timeout")  # type: ignore[arg-type]
    refused(lambda: job.wait(timeout=float("nan")), "timeout")
    job.wait(timeout=60)
    refused(lambda: job.files.download("out.txt", 5), "dest")  # type: ignore[arg-type]
    refused(lambda: job.files.download(b"out.txt", tmp_path), "path")  # type: ignore[arg-type]
    refused(lambda: job.outputs["o"].download(b"x"), "path")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make, field", [
    (lambda: nodus.Sweep({"command": ["true"], "timeout": object()}), "template.timeout"),
    (lambda: nodus.Sweep({"command": ["true"]}, name=b"s"), "name"),
    (lambda: nodus.Sweep({"command": ["true"]}, labels={"k": b"v"}), "labels"),
    (lambda: nodus.Sweep({"command": ["true"]}, max_cost=object()), "max_cost"),
])
def test_sweep_arguments_json_cannot_say(daemon: testing.Daemon, make: Callable[[], Any],
                                         field: str) -> None:
    refused(lambda: make().run(), field)
    assert daemon.client().list_sweeps(all=True) == []


@pytest.mark.parametrize("grid", [{"X": 5}, {"X": None}, {"X": b"ab"}, [1, 2], "X=1"])
def test_a_grid_that_is_not_lists_of_values(daemon: testing.Daemon, grid: Any) -> None:
    refused(lambda: nodus.Sweep({"command": ["true"]}, grid=grid).run(), "grid")
    assert daemon.client().list_sweeps(all=True) == []


def test_sweep_handles_and_waits(daemon: testing.Daemon) -> None:
    refused(lambda: nodus.Sweep.from_name(b"s"), "name")
    sweep = nodus.Sweep({"command": ["true"]}, grid={"X": [1]}).run()
    refused(lambda: sweep.wait(timeout=[1]), "timeout")  # type: ignore[arg-type]
    assert sweep.wait(timeout=60).phase == "Succeeded"


# --- a source its user cannot read ----------------------------------------------------------

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
