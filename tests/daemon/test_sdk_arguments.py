"""The SDK refuses arguments it cannot send with its own InvalidArgument naming the argument
(never json's TypeError, an AttributeError or a PermissionError from packing a source), and
creates nothing when it does. A source its user cannot read is tried as that user in
tests/system/test_source_as_its_user.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from tests.daemon.conftest import job_names, sweep_names


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
    before = job_names(daemon)
    message = refused(lambda: nodus.Job.run(**kwargs), field)
    if isinstance(kwargs.get(field), bytes):
        assert "decode" in message
    assert job_names(daemon) == before


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
    before = sweep_names(daemon)
    refused(lambda: make().run(), field)
    assert sweep_names(daemon) == before


@pytest.mark.parametrize("grid", [{"X": 5}, {"X": None}, {"X": b"ab"}, [1, 2], "X=1"])
def test_a_grid_that_is_not_lists_of_values(daemon: testing.Daemon, grid: Any) -> None:
    before = sweep_names(daemon)
    refused(lambda: nodus.Sweep({"command": ["true"]}, grid=grid).run(), "grid")
    assert sweep_names(daemon) == before


def test_sweep_handles_and_waits(daemon: testing.Daemon) -> None:
    refused(lambda: nodus.Sweep.from_name(b"s"), "name")
    sweep = nodus.Sweep({"command": ["true"]}, grid={"X": [1]}).run()
    refused(lambda: sweep.wait(timeout=[1]), "timeout")  # type: ignore[arg-type]
    assert sweep.wait(timeout=60).phase == "Succeeded"


# --- a source its user cannot read ----------------------------------------------------------


