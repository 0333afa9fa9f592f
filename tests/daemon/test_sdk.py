"""The SDK as a user writes it, against a real daemon: Views, wait() and its exceptions,
sync and async logs, cancel, attempts, refusals that leave nothing. Its surface without a
daemon: tests/unit/test_sdk_surface.py."""

from __future__ import annotations

import asyncio

import pytest

import noduslocal as nodus
from noduslocal import testing
from tests.daemon.conftest import job_names


def test_run_wait_and_view(daemon: testing.Daemon) -> None:
    job = nodus.Job.run(name="hello", command=["sh", "-c"], args=["echo $GREETING"],
                        env={"GREETING": "hi"}, labels={"kind": "demo"})
    done = job.wait(timeout=20)
    assert done.phase == done["phase"] == "Succeeded"
    assert done.exit_code == 0 and done.labels.kind == "demo"
    assert list(job.iter_logs()) == ["hi"]
    again = nodus.Job.from_name("hello")
    assert again.status().spec.command == ["sh", "-c"]
    with pytest.raises(AttributeError):
        _ = done.no_such_field
    plain = done.to_dict()  # a plain, independent copy of the JSON
    assert plain["labels"] == {"kind": "demo"} and isinstance(plain["labels"], dict)
    plain["labels"]["kind"] = "changed"
    assert done.labels.kind == "demo"


def test_wait_raises_jobfailed_with_exit_code_and_tail(daemon: testing.Daemon) -> None:
    job = nodus.Job.run(command=["sh", "-c", "echo working; echo broken >&2; exit 3"])
    with pytest.raises(nodus.errors.JobFailed) as info:
        job.wait(timeout=20)
    assert info.value.exit_code == 3
    assert info.value.reason == "Error"
    assert "broken" in info.value.log_tail and "working" in info.value.log_tail
    assert "exit" in str(info.value) and "broken" in str(info.value)


def test_cancel_and_jobcancelled(daemon: testing.Daemon) -> None:
    job = nodus.Job.run(command=["sleep", "60"])
    job.cancel()
    with pytest.raises(nodus.errors.JobCancelled) as info:
        job.wait(timeout=20)
    assert isinstance(info.value, nodus.errors.JobFailed)
    assert info.value.phase == "Cancelled"
    assert [a.reason for a in job.attempts()] == ["Cancelled"]


def test_wait_timeout(daemon: testing.Daemon) -> None:
    job = nodus.Job.run(command=["sleep", "30"])
    with pytest.raises(nodus.errors.WaitTimeout):
        job.wait(timeout=0.3)
    with pytest.raises(TimeoutError):  # WaitTimeout is a TimeoutError too
        job.wait(timeout=0.1)
    job.cancel()


def test_timeout_argument_stops_the_job(daemon: testing.Daemon) -> None:
    job = nodus.Job.run(command=["sleep", "30"], timeout="1s")
    with pytest.raises(nodus.errors.JobFailed) as info:
        job.wait(timeout=20)
    assert info.value.reason == "Timeout"


def test_async_logs_follow(daemon: testing.Daemon) -> None:
    job = nodus.Job.run(command=["sh", "-c", "echo a; sleep 0.3; echo b; printf c"])

    async def collect() -> list[str]:
        return [line async for line in job.logs(follow=True)]

    assert asyncio.run(collect()) == ["a", "b", "c"]


def test_workdir_defaults_to_the_kept_workspace(daemon: testing.Daemon) -> None:
    job = nodus.Job.run(command=["sh", "-c", 'pwd; echo "$NODUS_WORKSPACE"; touch made'])
    job.wait(timeout=20)
    cwd, workspace = list(job.iter_logs())
    assert cwd == workspace
    assert (daemon.data_dir / "jobs").exists()
    assert any(p.name == "made" for p in (daemon.data_dir / "jobs").glob("*/workspace/*"))


def test_reference_arguments_refused_with_their_field_leave_nothing(
        daemon: testing.Daemon) -> None:
    before = job_names(daemon)
    with pytest.raises(nodus.errors.InvalidArgument) as info:
        nodus.Job.create(command=["true"], completions=2, parallelism=3)
    assert info.value.field == "parallelism"
    with pytest.raises(nodus.errors.InvalidArgument) as info:
        nodus.Job.create(command=["true"], distributed=nodus.Distributed(nodes=2,
                                                                          launcher="Slurm"))
    assert info.value.field == "distributed.launcher"
    assert job_names(daemon) == before


