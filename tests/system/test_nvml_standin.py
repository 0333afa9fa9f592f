"""The stand-in libnvidia-ml.so.1 (tests/nvml_standin) as the real pynvml sees it.

pynvml keeps the library it loaded for the life of a process, so every scenario runs in a
fresh interpreter that loads the stand-in through LD_LIBRARY_PATH (or ctypes.CDLL with
RTLD_GLOBAL) and reads its state from a JSON file named by NODUS_FAKE_NVML.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.nvml_standin import build as standin
from tests.unit.test_nvml_standin_state import gpu

STANDIN_PARENT = Path(standin.__file__).resolve().parent.parent
RESULT = "@@RESULT@@"
GiB = 1 << 30

PRELUDE = f"""\
import ctypes, json, os, sys, threading, time
sys.path.insert(0, {str(STANDIN_PARENT)!r})
import pynvml as N
from tests.nvml_standin.build import write_state
STATE = os.environ.get("NODUS_FAKE_NVML")

def h(i):
    return N.nvmlDeviceGetHandleByIndex(i)

def err(fn, *args):
    '''The name of the NVMLError subclass that fn(*args) raises, or None.'''
    try:
        fn(*args)
    except N.NVMLError as e:
        return type(e).__name__
    return None

out = {{}}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return standin.build_or_skip(tmp_path_factory.mktemp("nvml-standin"))


def run(lib: Path, state: dict[str, Any] | Path | None, body: str, *, tmp: Path,
        ld_library_path: bool = True, init: bool = True) -> tuple[dict[str, Any], str]:
    """Run PRELUDE + body in a new interpreter against the stand-in and return (out, stderr),
    where `out` is the dict the body filled in."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", standin.STATE_ENV)}
    if ld_library_path:
        env["LD_LIBRARY_PATH"] = str(lib.parent)
    if isinstance(state, dict):
        state_path = tmp / "state.json"
        standin.write_state(state_path, state)
        env[standin.STATE_ENV] = str(state_path)
    elif isinstance(state, Path):
        env[standin.STATE_ENV] = str(state)
    script = (PRELUDE + ("N.nvmlInit()\n" if init else "") + textwrap.dedent(body)
              + f"\nprint({RESULT!r} + json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, f"scenario failed:\n{proc.stdout}\n{proc.stderr}"
    line = next(x for x in proc.stdout.splitlines() if x.startswith(RESULT))
    return json.loads(line[len(RESULT):]), proc.stderr


def test_inventory_and_metrics(lib: Path, tmp_path: Path) -> None:
    state = {
        "driver_version": "550.54.15",
        "gpus": [
            gpu(0, memory_used=3 * GiB, utilization_gpu=87, utilization_memory=41,
                power_mw=612345, energy_mj=987654321012, numa_node=0),
            gpu(1, name="NVIDIA A100-SXM4-40GB", pci_bus_id="00000001:b1:00.0",
                memory_total=40 * GiB, memory_used=40 * GiB, utilization_gpu=100,
                power_mw=400000, energy_mj=5, numa_node=1, temperature_c=71),
            gpu(2, uuid="GPU-last"),
        ],
    }
    out, _ = run(lib, state, """
        maps = open("/proc/self/maps").read().splitlines()
        out["loaded"] = sorted({l.split()[-1] for l in maps if "libnvidia-ml" in l})
        out["driver"] = N.nvmlSystemGetDriverVersion()
        out["count"] = N.nvmlDeviceGetCount()
        out["gpus"] = []
        for i in range(out["count"]):
            d = h(i)
            pci = N.nvmlDeviceGetPciInfo_v3(d)
            mem = N.nvmlDeviceGetMemoryInfo(d)
            util = N.nvmlDeviceGetUtilizationRates(d)
            uuid = N.nvmlDeviceGetUUID(d)
            out["gpus"].append({
                "index": N.nvmlDeviceGetIndex(d),
                "name": N.nvmlDeviceGetName(d),
                "uuid": uuid,
                "by_uuid": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(uuid)),
                "by_pci": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(pci.busId)),
                "pci": [pci.busId, pci.busIdLegacy, pci.domain, pci.bus,
                        pci.device, pci.pciDeviceId, ctypes.sizeof(pci)],
                "memory": [mem.total, mem.used, mem.free],
                "util": [util.gpu, util.memory],
                "power": N.nvmlDeviceGetPowerUsage(d),
                "energy": N.nvmlDeviceGetTotalEnergyConsumption(d),
                "numa": N.nvmlDeviceGetNumaNodeId(d),
                "minor": N.nvmlDeviceGetMinorNumber(d),
                "temp": N.nvmlDeviceGetTemperature(d, N.NVML_TEMPERATURE_GPU),
            })
        out["unknown_uuid"] = err(N.nvmlDeviceGetHandleByUUID, b"GPU-nope")
        out["index_out_of_range"] = err(N.nvmlDeviceGetHandleByIndex, 3)
        N.nvmlShutdown()
    """, tmp=tmp_path)
    assert out["loaded"] == [str(lib)]
    assert out["driver"] == "550.54.15"
    assert out["count"] == 3
    g0, g1, g2 = out["gpus"]
    assert [g["index"] for g in out["gpus"]] == [0, 1, 2]
    assert [g["by_uuid"] for g in out["gpus"]] == [0, 1, 2]
    assert [g["by_pci"] for g in out["gpus"]] == [0, 1, 2]
    assert [g["name"] for g in out["gpus"]] == [
        "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"]
    assert [g["uuid"] for g in out["gpus"]] == [
        "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd", "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",
        "GPU-last"]
    assert g0["pci"] == ["00000000:17:00.0", "0000:17:00.0", 0, 0x17, 0, 0x233010DE, 68]
    # bus ids come back the way NVML writes them: upper case, 8-digit domain
    assert g1["pci"] == ["00000001:B1:00.0", "0001:B1:00.0", 1, 0xB1, 0, 0x233010DE, 68]
    assert g0["memory"] == [80 * GiB, 3 * GiB, 77 * GiB]
    assert g1["memory"] == [40 * GiB, 40 * GiB, 0]
    assert (g0["util"], g1["util"], g2["util"]) == ([87, 41], [100, 0], [0, 0])
    assert (g0["power"], g1["power"], g2["power"]) == (612345, 400000, 70000)
    assert (g0["energy"], g1["energy"]) == (987654321012, 5)
    assert (g0["numa"], g1["numa"]) == (0, 1)
    assert [g["minor"] for g in out["gpus"]] == [0, 1, 2]
    assert (g0["temp"], g1["temp"]) == (35, 71)
    assert out["unknown_uuid"] == "NVMLError_NotFound"
    assert out["index_out_of_range"] == "NVMLError_InvalidArgument"


def test_process_lists_follow_the_insufficient_size_protocol(lib: Path, tmp_path: Path) -> None:
    procs = [{"pid": 4242, "used_memory": 1 * GiB},
             {"pid": 4243, "used_memory": 123456789},
             {"pid": 99999, "used_memory": None}]
    state = {"gpus": [gpu(0), gpu(1, processes=procs)]}
    out, _ = run(lib, state, """
        out["lists"] = [[[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId]
                         for p in N.nvmlDeviceGetComputeRunningProcesses(h(i))]
                        for i in range(2)]
        fn = N._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
        raw = []
        n = ctypes.c_uint(0)
        raw.append([fn(h(0), ctypes.byref(n), None), n.value])
        n = ctypes.c_uint(0)
        raw.append([fn(h(1), ctypes.byref(n), None), n.value])
        n = ctypes.c_uint(2)
        arr = (N.c_nvmlProcessInfo_v3_t * 2)()
        raw.append([fn(h(1), ctypes.byref(n), arr), n.value])
        n = ctypes.c_uint(8)
        arr = (N.c_nvmlProcessInfo_v3_t * 8)()
        raw.append([fn(h(1), ctypes.byref(n), arr), n.value, [p.pid for p in arr[:3]]])
        out["raw"] = raw
        out["struct_size"] = ctypes.sizeof(N.c_nvmlProcessInfo_v3_t)
        out["graphics"] = len(N.nvmlDeviceGetGraphicsRunningProcesses(h(1)))
    """, tmp=tmp_path)
    assert out["lists"][0] == []
    none = 0xFFFFFFFF
    assert out["lists"][1] == [[4242, GiB, none, none], [4243, 123456789, none, none],
                               [99999, None, none, none]]  # pynvml maps N/A memory to None
    assert out["raw"] == [[0, 0], [7, 3], [7, 3], [0, 3, [4242, 4243, 99999]]]
    assert out["struct_size"] == 24
    assert out["graphics"] == 0


def test_topology_and_nvlink_p2p(lib: Path, tmp_path: Path) -> None:
    topology = [[0, 10, 40, 50],
                [10, 0, 30, 50],
                [40, 30, 0, 20],
                [50, 50, 20, 0]]
    state = {"gpus": [gpu(i) for i in range(4)], "topology": topology,
             "nvlink": [[0, 3], [2, 1]]}
    out, _ = run(lib, state, """
        R = range(4)
        out["ancestor"] = [[N.nvmlDeviceGetTopologyCommonAncestor(h(i), h(j)) for j in R]
                           for i in R]
        pairs = [(i, j) for i in R for j in R if i != j]
        out["nvlink"] = {f"{i}{j}": N.nvmlDeviceGetP2PStatus(h(i), h(j),
                                                              N.NVML_P2P_CAPS_INDEX_NVLINK)
                         for i, j in pairs}
        out["read"] = {f"{i}{j}": N.nvmlDeviceGetP2PStatus(h(i), h(j), 0) for i, j in pairs}
        out["self"] = err(N.nvmlDeviceGetP2PStatus, h(0), h(0), N.NVML_P2P_CAPS_INDEX_NVLINK)
    """, tmp=tmp_path)
    assert out["ancestor"] == topology
    ok, not_supported, ioh = 0, 5, 3
    assert out["nvlink"] == {"01": not_supported, "02": not_supported, "03": ok,
                             "10": not_supported, "12": ok, "13": not_supported,
                             "20": not_supported, "21": ok, "23": not_supported,
                             "30": ok, "31": not_supported, "32": not_supported}
    # PCIe P2P up to a host bridge, or over NVLink even across sockets
    assert out["read"] == {"01": ok, "02": ioh, "03": ok, "10": ok, "12": ok, "13": ioh,
                           "20": ioh, "21": ok, "23": ok, "30": ok, "31": ioh, "32": ok}
    assert out["self"] == "NVMLError_InvalidArgument"


def test_default_topology_is_system_between_gpus(lib: Path, tmp_path: Path) -> None:
    out, _ = run(lib, {"gpus": [{}, {}]}, """
        out["levels"] = [N.nvmlDeviceGetTopologyCommonAncestor(h(0), h(1)),
                         N.nvmlDeviceGetTopologyCommonAncestor(h(1), h(1))]
        out["uuids"] = [N.nvmlDeviceGetUUID(h(i)) for i in range(2)]
    """, tmp=tmp_path)
    assert out["levels"] == [50, 0]
    assert out["uuids"] == ["GPU-5afe0000-0000-4000-8000-000000000000",
                            "GPU-5afe0000-0000-4000-8000-000000000001"]


def test_mig_mode_and_unsupported_fields(lib: Path, tmp_path: Path) -> None:
    state = {"gpus": [gpu(0, mig_mode=0), gpu(1, mig_mode=1, mig_pending=0),
                      gpu(2, mig_mode=None, numa_node=None)]}
    out, _ = run(lib, state, """
        out["mig"] = [N.nvmlDeviceGetMigMode(h(0)), N.nvmlDeviceGetMigMode(h(1)),
                      err(N.nvmlDeviceGetMigMode, h(2))]
        out["numa"] = err(N.nvmlDeviceGetNumaNodeId, h(2))
    """, tmp=tmp_path)
    assert out["mig"] == [[0, 0], [1, 0], "NVMLError_NotSupported"]
    assert out["numa"] == "NVMLError_NotSupported"


def test_missing_gpu_is_lost(lib: Path, tmp_path: Path) -> None:
    state = {"gpus": [gpu(0), gpu(1, missing=True)]}
    out, _ = run(lib, state, """
        out["count"] = N.nvmlDeviceGetCount()
        out["by_index"] = err(N.nvmlDeviceGetHandleByIndex, 1)
        out["by_uuid"] = err(N.nvmlDeviceGetHandleByUUID,
                             b"GPU-00000001-aaaa-bbbb-cccc-dddddddddddd")
        out["gpu0"] = N.nvmlDeviceGetMemoryInfo(h(0)).total
        try:
            h(1)
        except N.NVMLError_GpuIsLost as e:
            out["class_ok"] = isinstance(e, N.NVMLError) and e.value == 15
            out["message"] = str(e)
    """, tmp=tmp_path)
    assert out["count"] == 2
    assert out["by_index"] == out["by_uuid"] == "NVMLError_GpuIsLost"
    assert out["gpu0"] == 80 * GiB
    assert out["class_ok"] is True
    assert out["message"] == "GPU is lost"


def test_state_file_change_is_seen_between_calls(lib: Path, tmp_path: Path) -> None:
    before = {"gpus": [gpu(0, memory_used=1 * GiB), gpu(1)]}
    after = {"gpus": [
        gpu(0, memory_used=5 * GiB, utilization_gpu=77, energy_mj=1000,
            processes=[{"pid": 10, "used_memory": 2 * GiB}, {"pid": 11, "used_memory": 3 * GiB}]),
        gpu(1, missing=True),
        gpu(2, uuid="GPU-new"),
    ]}
    back = {"gpus": [gpu(0), gpu(1)]}
    out, stderr = run(lib, before, f"""
        g0, g1 = h(0), h(1)
        def snap():
            return {{
                "count": N.nvmlDeviceGetCount(),
                "used": N.nvmlDeviceGetMemoryInfo(g0).used,
                "util": N.nvmlDeviceGetUtilizationRates(g0).gpu,
                "energy": N.nvmlDeviceGetTotalEnergyConsumption(g0),
                "pids": [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(g0)],
                "gpu1": err(N.nvmlDeviceGetName, g1),
            }}
        out["before"] = snap()
        write_state(STATE, {after!r})
        out["after"] = snap()
        out["new_gpu"] = N.nvmlDeviceGetUUID(h(2))
        # a rewrite that does not parse leaves the last good state in place
        with open(STATE + ".tmp", "w") as f:
            f.write('{{"gpus": [')
        os.replace(STATE + ".tmp", STATE)
        out["broken"] = snap()
        write_state(STATE, {back!r})
        out["back"] = snap()
    """, tmp=tmp_path)
    assert out["before"] == {"count": 2, "used": GiB, "util": 0, "energy": 0, "pids": [],
                             "gpu1": None}
    assert out["after"] == {"count": 3, "used": 5 * GiB, "util": 77, "energy": 1000,
                            "pids": [10, 11], "gpu1": "NVMLError_GpuIsLost"}
    assert out["new_gpu"] == "GPU-new"
    assert out["broken"] == out["after"]
    assert "keeping the previous state" in stderr
    assert out["back"] == {"count": 2, "used": 0, "util": 0, "energy": 0, "pids": [],
                           "gpu1": None}


def test_xid_event_delivered_once_then_timeout(lib: Path, tmp_path: Path) -> None:
    state = {
        "gpus": [gpu(0), gpu(1), gpu(2)],
        "events": [
            {"gpu": 1, "type": "xid", "data": 79, "seq": 1},
            {"gpu": 2, "type": "xid", "data": 13, "seq": 2},           # GPU 2 not registered
            {"gpu": 0, "type": "double_bit_ecc", "data": 0, "seq": 3},  # type not registered
        ],
    }
    later = {**state, "events": [*state["events"], {"gpu": 0, "type": "xid", "data": 48,
                                                    "seq": 4}]}
    out, _ = run(lib, state, f"""
        def ev(d):
            return [N.nvmlDeviceGetIndex(d.device), d.eventType, d.eventData,
                    d.gpuInstanceId, d.computeInstanceId]

        out["sizeof"] = ctypes.sizeof(N.c_nvmlEventData_t)
        out["supported"] = N.nvmlDeviceGetSupportedEventTypes(h(0))
        es = N.nvmlEventSetCreate()
        for i in (0, 1):
            N.nvmlDeviceRegisterEvents(h(i), N.nvmlEventTypeXidCriticalError, es)
        out["unsupported"] = err(N.nvmlDeviceRegisterEvents, h(0),
                                 N.nvmlEventTypeSingleBitEccErrorStorm, es)
        out["first"] = ev(N.nvmlEventSetWait_v2(es, 2000))
        t0 = time.monotonic()
        out["second"] = err(N.nvmlEventSetWait_v2, es, 300)
        out["waited"] = time.monotonic() - t0

        # an event written while another thread waits, with calls going on meanwhile
        got = {{}}
        def waiter():
            t = time.monotonic()
            try:
                got["event"] = ev(N.nvmlEventSetWait_v2(es, 10000))
            except N.NVMLError as e:
                got["event"] = type(e).__name__
            got["after"] = time.monotonic() - t
        th = threading.Thread(target=waiter)
        th.start()
        for _ in range(20):
            N.nvmlDeviceGetMemoryInfo(h(0))
            time.sleep(0.005)
        write_state(STATE, {later!r})
        for _ in range(20):
            N.nvmlDeviceGetUtilizationRates(h(1))
        th.join(15)
        out["threaded"] = dict(got)
        out["third"] = err(N.nvmlEventSetWait_v2, es, 50)

        # another set gets the same events once more, each once
        es2 = N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(h(1), N.nvmlEventTypeXidCriticalError, es2)
        out["set2"] = [ev(N.nvmlEventSetWait_v2(es2, 1000)), err(N.nvmlEventSetWait_v2, es2, 50)]
        N.nvmlEventSetFree(es)

        # shutdown ends a wait in progress
        got.clear()
        th = threading.Thread(target=waiter)
        es = es2
        th.start()
        time.sleep(0.1)
        N.nvmlShutdown()
        th.join(15)
        out["ended"] = got
    """, tmp=tmp_path)
    none = 0xFFFFFFFF
    assert out["sizeof"] == 32
    assert out["supported"] & 0x8
    assert out["unsupported"] == "NVMLError_NotSupported"
    assert out["first"] == [1, 0x8, 79, none, none]
    assert out["second"] == "NVMLError_Timeout"
    assert 0.25 <= out["waited"] < 5
    assert out["threaded"]["event"] == [0, 0x8, 48, none, none]
    assert out["threaded"]["after"] < 5
    assert out["third"] == "NVMLError_Timeout"
    assert out["set2"] == [[1, 0x8, 79, none, none], "NVMLError_Timeout"]
    assert out["ended"]["event"] == "NVMLError_Uninitialized"
    assert out["ended"]["after"] < 5


def test_preloaded_with_rtld_global_instead_of_ld_library_path(lib: Path, tmp_path: Path) -> None:
    out, _ = run(lib, {"gpus": [gpu(0), gpu(1)]}, f"""
        mine = ctypes.CDLL({str(lib)!r}, mode=ctypes.RTLD_GLOBAL)
        N.nvmlInit()
        out["same"] = N.nvmlLib._handle == mine._handle
        out["count"] = N.nvmlDeviceGetCount()
        out["uuid"] = N.nvmlDeviceGetUUID(h(1))
        out["ld"] = os.environ.get("LD_LIBRARY_PATH")
    """, tmp=tmp_path, ld_library_path=False, init=False)
    assert out == {"same": True, "count": 2, "ld": None,
                   "uuid": "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"}


def test_init_errors_and_refcount(lib: Path, tmp_path: Path) -> None:
    out, _ = run(lib, None, """
        out["unset"] = err(N.nvmlInit)
    """, tmp=tmp_path, init=False)
    assert out["unset"] == "NVMLError_DriverNotLoaded"

    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": [{"memory_use": 1}]}')
    out, stderr = run(lib, bad, """
        out["bad"] = err(N.nvmlInit)
    """, tmp=tmp_path, init=False)
    assert out["bad"] == "NVMLError_Unknown"
    assert 'gpus[0]: unknown key "memory_use"' in stderr

    out, _ = run(lib, {"gpus": [gpu(0)]}, """
        N.nvmlInit()  # second reference
        N.nvmlShutdown()
        out["still"] = N.nvmlDeviceGetCount()
        N.nvmlShutdown()
        out["after"] = err(N.nvmlDeviceGetCount)
        out["again"] = err(N.nvmlShutdown)
        N.nvmlInit()
        out["reinit"] = N.nvmlDeviceGetCount()
    """, tmp=tmp_path)
    assert out == {"still": 1, "after": "NVMLError_Uninitialized",
                   "again": "NVMLError_Uninitialized", "reinit": 1}


# what NOTES.md lists, what the daemon may call, and what pynvml resolves for them
SYMBOLS = (
    "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString",
    "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetP2PStatus", "nvmlDeviceGetMigMode", "nvmlDeviceGetNumaNodeId",
    "nvmlEventSetCreate", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2", "nvmlEventSetFree",
)


def test_exports_every_symbol_pynvml_needs(lib: Path, tmp_path: Path) -> None:
    out, _ = run(lib, {"gpus": [gpu(0)]}, f"""
        out["missing"] = [s for s in {SYMBOLS!r} if err(N._nvmlGetFunctionPointer, s)]
        out["errstr"] = N.nvmlErrorString(15)
        out["nvml_version"] = N.nvmlSystemGetNVMLVersion()
        out["cuda"] = N.nvmlSystemGetCudaDriverVersion_v2()
        m = N.nvmlDeviceGetMemoryInfo(h(0), version=N.nvmlMemory_v2)
        out["mem_v2"] = [m.total, m.reserved, m.free, m.used]
    """, tmp=tmp_path)
    assert out == {"missing": [], "errstr": "GPU is lost", "nvml_version": "12.550.54.15",
                   "cuda": 12040, "mem_v2": [80 * GiB, 0, 80 * GiB, 0]}


def test_build_is_skipped_when_up_to_date(lib: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    stamp = lib.stat().st_mtime_ns
    monkeypatch.setattr(standin.shutil, "which", lambda name: None)  # a rebuild would fail
    assert standin.build(lib.parent) == lib
    assert lib.stat().st_mtime_ns == stamp

    # without gcc: a skip locally, a failure under CI
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        standin.build_or_skip(tmp_path / "no-gcc")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        standin.build_or_skip(tmp_path / "no-gcc")
