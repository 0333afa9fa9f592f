"""The GPUs' history without a daemon: each GPU's ring keeps the newest samples up to its
capacity (a window of polls), wraps around in order, filters by `since` and by index, keeps
a departed GPU's samples until they age out, records no value where NVML gave none, follows
a changed gpu_poll, and invents nothing for simulated GPUs."""

from __future__ import annotations

import json
import math

from noduslocal.daemon.gpus.history import MIN_GAP, GpuHistory
from noduslocal.daemon.gpus.model import Gpu, Inventory
from noduslocal.daemon.gpus.service import simulated_inventory

GiB = 2**30
T0 = 1_700_000_000.0


def gpu(index: int, *, util: int | None = 50, memory: int = GiB, power_mw: int | None = 100_000,
        measured: bool = True) -> Gpu:
    return Gpu(index, f"GPU-{index:04d}", "NVIDIA H100 80GB HBM3", f"0:{index}:0.0", 80 * GiB,
               memory_used=memory, utilization=util, power_mw=power_mw, measured=measured)


def reading(at: float, *gpus: Gpu) -> Inventory:
    return Inventory(list(gpus), "nvml", read_at=at)


class Held:
    """What the daemon would say a job holds, changed by the test between readings."""

    def __init__(self) -> None:
        self.uuids: set[str] = set()

    def __call__(self) -> set[str]:
        return set(self.uuids)


def test_samples_come_back_as_columns_oldest_first() -> None:
    held = Held()
    history = GpuHistory(2.0, held)
    history.record(reading(T0, gpu(0, util=10), gpu(1, util=0)))
    held.uuids = {"GPU-0000"}
    history.record(reading(T0 + 2, gpu(0, util=90, memory=40 * GiB), gpu(1, util=0)))
    doc = history.view(reading(T0 + 2, gpu(0), gpu(1)), now=T0 + 3)
    assert doc["kind"] == "GpuHistory" and doc["source"] == "nvml" and doc["note"] == ""
    assert doc["interval"] == 2.0 and doc["window"] == 3600.0
    first = doc["gpus"][0]
    assert {k: first[k] for k in ("index", "uuid", "name", "memory_total")} == {
        "index": 0, "uuid": "GPU-0000", "name": "NVIDIA H100 80GB HBM3",
        "memory_total": 80 * GiB}
    assert first["t"] == [T0, T0 + 2]
    assert first["utilization"] == [10, 90]
    assert first["memory_used"] == [GiB, 40 * GiB]
    assert first["power"] == [100.0, 100.0]
    assert first["allocated"] == [0, 1]  # held by a job from the second reading on
    assert doc["gpus"][1]["allocated"] == [0, 0]
    json.dumps(doc, allow_nan=False)  # plain JSON: what a browser's JSON.parse reads


def test_the_ring_is_bounded_and_wraps_in_order() -> None:
    history = GpuHistory(1.0, set, window=5.0)
    assert history.capacity == 5
    for i in range(13):
        history.record(reading(T0 + i, gpu(0, util=i)))
    before = history.nbytes()
    for i in range(13, 40):
        history.record(reading(T0 + i, gpu(0, util=i)))
    assert history.nbytes() == before  # the arrays were allocated once, at capacity
    column = history.view(reading(T0 + 39, gpu(0)), now=T0 + 39)["gpus"][0]
    assert column["t"] == [T0 + i for i in range(35, 40)]
    assert column["utilization"] == list(range(35, 40))


def test_a_ring_holds_a_window_of_polls() -> None:
    history = GpuHistory(2.0, set)
    assert history.capacity == 1800  # an hour at the default gpu_poll
    for i in range(2000):
        history.record(reading(T0 + 2 * i, gpu(0)))
    assert len(history.view(reading(T0 + 3998, gpu(0)), now=T0 + 3998)["gpus"][0]["t"]) == 1800
    # 22 bytes a sample: time 8, utilisation 1, memory 8, power 4, allocated 1
    assert history.nbytes() == 1800 * 22


def test_since_gives_only_newer_samples() -> None:
    history = GpuHistory(1.0, set)
    for i in range(10):
        history.record(reading(T0 + i, gpu(0, util=i), gpu(1)))
    doc = history.view(reading(T0 + 9, gpu(0), gpu(1)), since=T0 + 6, now=T0 + 9)
    assert doc["gpus"][0]["t"] == [T0 + 7, T0 + 8, T0 + 9]
    assert doc["gpus"][0]["utilization"] == [7, 8, 9]
    assert all(len(doc["gpus"][1][k]) == 3 for k in ("t", "utilization", "memory_used",
                                                     "power", "allocated"))
    later = history.view(reading(T0 + 9, gpu(0), gpu(1)), since=T0 + 9, now=T0 + 9)
    assert later["gpus"][0]["t"] == [] and later["gpus"][0]["power"] == []


def test_index_picks_one_gpu() -> None:
    history = GpuHistory(1.0, set)
    history.record(reading(T0, gpu(0, util=1), gpu(1, util=2), gpu(2, util=3)))
    now = reading(T0, gpu(0), gpu(1), gpu(2))
    doc = history.view(now, index=1, now=T0)
    assert [(g["index"], g["utilization"]) for g in doc["gpus"]] == [(1, [2])]
    assert history.indexes(now) == {0, 1, 2}


def test_samples_older_than_the_window_are_not_shown() -> None:
    history = GpuHistory(10.0, set, window=60.0)
    for i in range(5):
        history.record(reading(T0 + 10 * i, gpu(0)))
    doc = history.view(reading(T0 + 40, gpu(0)), now=T0 + 85)
    assert doc["gpus"][0]["t"] == [T0 + 30, T0 + 40]


def test_a_gpu_that_leaves_keeps_its_history_until_it_ages_out() -> None:
    history = GpuHistory(10.0, set, window=60.0)
    history.record(reading(T0, gpu(0), gpu(1, util=77)))
    history.record(reading(T0 + 10, gpu(0), gpu(1, util=78)))
    for i in range(2, 7):  # GPU 1 is no longer read at all
        history.record(reading(T0 + 10 * i, gpu(0)))
    now = reading(T0 + 60, gpu(0))
    doc = history.view(now, now=T0 + 60)
    assert [g["uuid"] for g in doc["gpus"]] == ["GPU-0000", "GPU-0001"]
    assert doc["gpus"][1]["utilization"] == [78]  # T0 is a window old: out
    assert doc["gpus"][1]["index"] == 1 and 1 in history.indexes(now)
    assert history.view(now, index=1, now=T0 + 60)["gpus"][0]["uuid"] == "GPU-0001"
    history.record(reading(T0 + 70, gpu(0)))
    assert [g["uuid"] for g in history.view(now, now=T0 + 70)["gpus"]] == ["GPU-0000"]
    assert history.indexes(now) == {0}


def test_values_nvml_did_not_give_are_null_never_invented() -> None:
    history = GpuHistory(1.0, set)
    history.record(reading(T0, gpu(0, power_mw=None, util=None)))
    history.record(reading(T0 + 1, gpu(0, power_mw=250_500)))
    history.record(reading(T0 + 2, gpu(0, measured=False)))  # fell off the bus
    column = history.view(reading(T0 + 2, gpu(0)), now=T0 + 2)["gpus"][0]
    assert column["power"] == [None, 250.5, None]
    assert column["utilization"] == [None, 50, None]
    assert column["memory_used"] == [GiB, GiB, None]
    assert len(column["allocated"]) == 3


def test_nan_and_impossible_readings_are_null() -> None:
    history = GpuHistory(1.0, set)
    odd = gpu(0)
    odd.power_mw = math.nan  # type: ignore[assignment]
    odd.utilization = 250
    history.record(reading(T0, odd))
    column = history.view(reading(T0, gpu(0)), now=T0)["gpus"][0]
    assert column["power"] == [None] and column["utilization"] == [None]
    json.dumps(column, allow_nan=False)


def test_a_gpu_never_measured_gets_no_ring() -> None:
    history = GpuHistory(1.0, set)
    history.record(reading(T0, gpu(0), Gpu(1, "index-1", "unknown", "", 0, healthy=False,
                                           measured=False)))
    assert history.indexes(reading(T0, gpu(0))) == {0}
    assert history.nbytes() == 22 * history.capacity


def test_simulated_gpus_have_no_history_and_say_so() -> None:
    history = GpuHistory(2.0, set)
    simulated = simulated_inventory("2xH100-80GB")
    history.record(simulated)  # the daemon never polls them; nothing is kept if it did
    doc = history.view(simulated)
    assert doc["source"] == "simulated" and "no readings" in doc["note"]
    assert [g["index"] for g in doc["gpus"]] == [0, 1]
    assert all(g["t"] == [] and g["utilization"] == [] for g in doc["gpus"])
    assert history.nbytes() == 0
    none = history.view(Inventory([], "none", "NVML unavailable (no driver)"))
    assert none["source"] == "none" and none["gpus"] == [] and "NVML" in none["note"]


def test_a_new_gpu_poll_resizes_the_rings_keeping_the_newest() -> None:
    history = GpuHistory(1.0, set, window=10.0)
    for i in range(10):
        history.record(reading(T0 + i, gpu(0, util=i)))
    history.resize(2.0)
    assert history.capacity == 5 and history.period == 2.0
    column = history.view(reading(T0 + 9, gpu(0)), now=T0 + 9)["gpus"][0]
    assert column["utilization"] == [5, 6, 7, 8, 9]
    history.record(reading(T0 + 11, gpu(0, util=11)))
    assert history.view(reading(T0 + 11, gpu(0)), now=T0 + 11)["gpus"][0]["utilization"] \
        == [6, 7, 8, 9, 11]


def test_a_tiny_gpu_poll_cannot_make_the_rings_large() -> None:
    history = GpuHistory(0.001, set)
    assert history.capacity == round(3600 / MIN_GAP) == 40_000
    for i in range(100):  # polls every millisecond: one sample per MIN_GAP is kept
        history.record(reading(T0 + i / 1000, gpu(0)))
    assert history.view(reading(T0, gpu(0)), now=T0 + 1)["gpus"][0]["t"] == [T0, T0 + 0.09]
    steady = GpuHistory(0.1, set)  # a 0.1 s poll, with its float jitter, is kept whole
    for i in range(50):
        steady.record(reading(T0 + i * 0.1, gpu(0)))
    assert len(steady.view(reading(T0, gpu(0)), now=T0 + 5)["gpus"][0]["t"]) == 50
