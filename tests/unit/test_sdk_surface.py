"""The SDK's surface without a daemon: the public names, Job.create's reference keywords,
and the one clear error when no daemon answers."""

from __future__ import annotations

import inspect

import pytest

import noduslocal as nodus

REFERENCE_CREATE = [
    "name", "image", "command", "args", "source", "gpu", "cpu", "memory", "disk", "env",
    "secrets", "volumes", "workdir", "network", "checkpoint", "timeout", "expected_duration",
    "interruptible", "region", "profile", "max_cost", "completions", "parallelism",
    "distributed", "outputs", "labels", "allow_large_source", "project",
]


def test_public_surface_is_pinned() -> None:
    assert sorted(nodus.__all__) == ["Client", "Distributed", "Job", "Sweep", "View",
                                     "__version__", "errors", "report"]


def test_create_has_exactly_the_reference_keywords() -> None:
    params = inspect.signature(nodus.Job.create).parameters
    # noduslocal's own after them (issue 28): `export`, the CLI's --export, and `after`,
    # Slurm's dependencies
    assert list(params) == [*REFERENCE_CREATE, "export", "after"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    with pytest.raises(TypeError):
        nodus.Job.create(command=["true"], retries=2)  # type: ignore[call-arg]


def test_no_daemon_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODUSLOCAL_SOCKET", "/tmp/nl-none/api.sock")
    with pytest.raises(nodus.errors.DaemonUnavailable, match=r"/tmp/nl-none/api\.sock"):
        nodus.Job.create(command=["true"])
