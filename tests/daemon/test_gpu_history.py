"""GET /v1/gpus/history through a real daemon reading the stand-in libnvidia-ml.so.1
(tests/nvml_standin) every 0.2 s: samples accumulate poll by poll as columns, follow what
NVML reports and which GPU a job holds, `since` and `gpu` narrow them, bad values of either
are a 400 naming it, a GPU that falls off the bus gets nulls, and simulated GPUs have no
history and say so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.domain.states import Phase
from tests.nvml_standin.build import STATE_ENV, build_or_skip, sample_state, write_state

COLUMNS = ("t", "utilization", "memory_used", "power", "allocated")
POLL = 0.2  # seconds between the daemon's GPU readings here


class Box:
    def __init__(self, daemon: testing.Daemon, state_path: Path) -> None:
        self.daemon = daemon
        self.state_path = state_path
        self.state = sample_state(2)

    def write(self) -> None:
        write_state(self.state_path, self.state)

    def history(self, **query: Any) -> dict[str, Any]:
        doc: dict[str, Any] = self.daemon.client().transport.request(
            "GET", "/v1/gpus/history", query=query or None)
        return doc


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    nvml_lib = build_or_skip(tmp_path_factory.mktemp("nvml"))
    state_path = tmp_path_factory.mktemp("state") / "nvml.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STATE_ENV, str(state_path))  # the daemon inherits it
        d = testing.Daemon(cpus=2, memory="4GiB",
                           config=f'nvml_library = "{nvml_lib}"\ngpu_poll = {POLL}\n')
        box = Box(d, state_path)
        box.write()
        try:
            d.start()
            with d.as_default():
                yield box
        finally:
            d.close()


def samples(box: Box, index: int, least: int, **query: Any) -> dict[str, Any]:
    """GPU `index`'s columns once they hold at least `least` samples."""
    def enough() -> dict[str, Any] | None:
        gpu = next(g for g in box.history(**query)["gpus"] if g["index"] == index)
        return gpu if len(gpu["t"]) >= least else None

    return testing.wait_until(enough, f"{least} samples of GPU {index}")


def test_samples_accumulate_poll_by_poll_as_columns(box: Box) -> None:
    box.state["gpus"][1].update(utilization_gpu=37, memory_used=5 * 2**30, power_mw=123_456)
    box.write()
    doc = box.history()
    assert doc["kind"] == "GpuHistory" and doc["source"] == "nvml" and doc["note"] == ""
    assert doc["interval"] == POLL and doc["window"] == 3600
    assert [(g["index"], g["uuid"]) for g in doc["gpus"]] == [
        (i, box.state["gpus"][i]["uuid"]) for i in range(2)]
    assert doc["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert doc["gpus"][0]["memory_total"] == box.state["gpus"][0]["memory_total"]
    first = len(samples(box, 1, 2)["t"])
    gpu = samples(box, 1, first + 2)  # the history grows with the polls
    assert {len(gpu[c]) for c in COLUMNS} == {len(gpu["t"])}
    assert gpu["t"] == sorted(gpu["t"])
    assert all(t > 1e9 for t in gpu["t"])  # unix seconds
    latest = samples(box, 1, 1, since=gpu["t"][-1])  # a reading after the new state
    assert latest["utilization"][-1] == 37
    assert latest["memory_used"][-1] == 5 * 2**30
    assert latest["power"][-1] == 123.456
    assert set(gpu["allocated"]) == {0}


def test_a_job_on_a_gpu_shows_as_allocated(box: Box, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    job = nodus.Job.run(command=["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                        gpu=1)
    testing.wait_until(lambda: job.status()["phase"] == Phase.RUNNING, "the job running")
    uuid = job.attempts()[0]["gpus"][0]
    held = next(g["index"] for g in box.history()["gpus"] if g["uuid"] == uuid)
    since = samples(box, held, 1)["t"][-1]
    gpu = samples(box, held, 1, since=since)
    assert gpu["allocated"][-1] == 1
    other = samples(box, 1 - held, 1, since=since)
    assert other["allocated"][-1] == 0
    gate.touch()
    assert job.wait(timeout=30).phase == Phase.SUCCEEDED


def test_since_and_gpu_narrow_the_history(box: Box) -> None:
    samples(box, 0, 3)
    whole = box.history()
    cut = whole["gpus"][0]["t"][-2]
    newer = box.history(since=cut)
    for gpu in newer["gpus"]:
        assert gpu["t"] and all(t > cut for t in gpu["t"])
        assert {len(gpu[c]) for c in COLUMNS} == {len(gpu["t"])}
    one = box.history(gpu=1)
    assert [g["index"] for g in one["gpus"]] == [1]
    assert box.history(gpu=0, since=10**10)["gpus"][0]["t"] == []  # nothing that new


@pytest.mark.parametrize(("query", "field"), [
    ({"gpu": "x"}, "gpu"), ({"gpu": "-1"}, "gpu"), ({"gpu": "9"}, "gpu"),
    ({"gpu": "1.5"}, "gpu"), ({"since": "nan"}, "since"), ({"since": "-1"}, "since"),
    ({"since": "inf"}, "since"), ({"since": "yesterday"}, "since"),
])
def test_bad_parameters_are_a_400_naming_them(box: Box, query: dict[str, str],
                                               field: str) -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        box.history(**query)
    assert info.value.field == field
    assert field in info.value.message


def test_a_gpu_that_falls_off_the_bus_gets_null_samples(box: Box) -> None:
    since = samples(box, 1, 1)["t"][-1]
    box.state["gpus"][1]["missing"] = True
    box.write()
    try:
        def null_power() -> dict[str, Any] | None:
            gpu = box.history(gpu=1, since=since)["gpus"][0]
            return gpu if None in gpu["power"] else None

        gpu = testing.wait_until(null_power, "a sample of the lost GPU without readings")
        at = gpu["power"].index(None)
        assert gpu["utilization"][at] is None and gpu["memory_used"][at] is None
        assert gpu["uuid"] == box.state["gpus"][1]["uuid"]  # its history goes on
        assert samples(box, 0, 1, since=since)["power"][-1] == 70.0  # the other is read
    finally:
        box.state["gpus"][1]["missing"] = False
        box.write()


def test_simulated_gpus_have_no_history_and_say_so() -> None:
    with testing.daemon(config='simulate_gpus = "2xL4"\ngpu_poll = 0.2\n') as d:
        doc = d.client().transport.request("GET", "/v1/gpus/history")
        assert doc["source"] == "simulated" and "no readings" in doc["note"]
        assert [g["index"] for g in doc["gpus"]] == [0, 1]
        assert all(g[c] == [] for g in doc["gpus"] for c in COLUMNS)
