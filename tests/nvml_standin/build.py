"""Build the stand-in libnvidia-ml.so.1 (libnvidia-ml.c) and write the JSON state it serves.

    from nvml_standin.build import build, write_state, standin_env
    lib = build(tmp_dir)                       # tmp_dir/libnvidia-ml.so.1, rebuilt only if stale
    write_state(state_path, {"gpus": [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}]})
    env = standin_env(lib.parent, state_path)  # LD_LIBRARY_PATH + NODUS_FAKE_NVML

or load it in-process with ``ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)`` before
``pynvml.nvmlInit()``. The schema is documented at the top of libnvidia-ml.c; ``write_state``
checks a state against it before writing, and rewrites the file atomically so a running
library never reads half a file.

    python -m tests.nvml_standin.build [OUT_DIR] [--sample-state FILE [--gpus N]]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().with_name("libnvidia-ml.c")
LIB_NAME = "libnvidia-ml.so.1"
STATE_ENV = "NODUS_FAKE_NVML"
GCC_ARGS = (
    "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-pthread",
    "-Wl,--no-undefined", "-Wl,-soname," + LIB_NAME,
)

# NVML topology levels (nvmlGpuTopologyLevel_t)
TOPOLOGY_INTERNAL = 0
TOPOLOGY_SINGLE = 10
TOPOLOGY_MULTIPLE = 20
TOPOLOGY_HOSTBRIDGE = 30
TOPOLOGY_NODE = 40
TOPOLOGY_SYSTEM = 50

EVENT_TYPES = {
    "single_bit_ecc": 0x1,
    "double_bit_ecc": 0x2,
    "pstate": 0x4,
    "xid": 0x8,
    "clock": 0x10,
    "power_source_change": 0x80,
    "mig_config_change": 0x100,
}


class GccMissingError(RuntimeError):
    """gcc is not on PATH."""


def build(out_dir: Path) -> Path:
    """Compile libnvidia-ml.c to out_dir/libnvidia-ml.so.1 unless that is newer than the
    source and this file; returns the library's path. Safe to call from parallel processes
    (it compiles to a temporary name and renames)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / LIB_NAME
    newest_input = max(SOURCE.stat().st_mtime_ns, Path(__file__).stat().st_mtime_ns)
    with contextlib.suppress(FileNotFoundError):
        if lib.stat().st_mtime_ns >= newest_input:
            return lib
    gcc = shutil.which("gcc")
    if gcc is None:
        raise GccMissingError("gcc is needed to build the NVML stand-in (apt-get install gcc)")
    fd, tmp = tempfile.mkstemp(prefix=".libnvidia-ml.", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        proc = subprocess.run([gcc, *GCC_ARGS, "-o", tmp, str(SOURCE)],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0 or proc.stderr.strip():
            raise RuntimeError(f"building the NVML stand-in failed:\n{proc.stderr}")
        os.replace(tmp, lib)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return lib


def build_or_skip(out_dir: Path) -> Path:
    """build() for pytest fixtures: without gcc the test is skipped, or failed when $CI is
    set (CI must run these tests)."""
    import pytest

    try:
        return build(out_dir)
    except GccMissingError as e:
        if os.environ.get("CI"):
            pytest.fail(f"{e} (CI is set, so this is a failure, not a skip)")
        pytest.skip(str(e))


def standin_env(lib_dir: Path, state_path: Path,
                base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a process that should see the stand-in: LD_LIBRARY_PATH starts with
    lib_dir and NODUS_FAKE_NVML names the state file."""
    env = dict(os.environ if base is None else base)
    rest = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = str(lib_dir) + (os.pathsep + rest if rest else "")
    env[STATE_ENV] = str(state_path)
    return env


def write_state(path: Path, state: Mapping[str, Any]) -> None:
    """Check `state` against the schema and write it as JSON atomically (temp + rename)."""
    validate_state(state)
    path = Path(path)
    data = json.dumps(state, indent=1).encode()
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def sample_state(n_gpus: int = 2) -> dict[str, Any]:
    """An idle H100 box: n GPUs, pairs (0,1), (2,3), ... NVLinked, GPUs split over two NUMA
    nodes by halves, and the matching topology matrix."""
    half = max(1, (n_gpus + 1) // 2)
    gpus = [{
        "index": i,
        "uuid": f"GPU-5afe0000-0000-4000-8000-{i:012x}",
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": f"00000000:{0x18 + 0x20 * i:02X}:00.0",
        "memory_total": 85520809984,
        "memory_used": 0,
        "utilization_gpu": 0,
        "utilization_memory": 0,
        "power_mw": 70000,
        "energy_mj": 0,
        "mig_mode": 0,
        "numa_node": i // half,
        "processes": [],
        "missing": False,
    } for i in range(n_gpus)]
    topology = [[TOPOLOGY_INTERNAL if i == j
                 else TOPOLOGY_HOSTBRIDGE if i // half == j // half
                 else TOPOLOGY_SYSTEM
                 for j in range(n_gpus)] for i in range(n_gpus)]
    return {
        "driver_version": "550.54.15",
        "gpus": gpus,
        "topology": topology,
        "nvlink": [[i, i + 1] for i in range(0, n_gpus - 1, 2)],
        "events": [],
    }


# ------------------------------------------------------------------ schema check

_INT = "int"
_INT_OR_NULL = "int|null"
_STR = "str"
_BOOL = "bool"

_TOP = {"driver_version": _STR, "cuda_driver_version": _INT, "gpus": list,
        "topology": list, "nvlink": list, "events": list}
_GPU = {"index": _INT, "uuid": _STR, "name": _STR, "pci_bus_id": _STR, "pci_device_id": _INT,
        "pci_subsystem_id": _INT, "minor_number": _INT, "memory_total": _INT,
        "memory_used": _INT, "utilization_gpu": _INT, "utilization_memory": _INT,
        "power_mw": _INT, "energy_mj": _INT, "temperature_c": _INT, "mig_mode": _INT_OR_NULL,
        "mig_pending": _INT, "numa_node": _INT_OR_NULL, "supported_events": _INT,
        "processes": list, "missing": _BOOL}
_PROC = {"pid": _INT, "used_memory": _INT_OR_NULL, "gpu_instance_id": _INT,
         "compute_instance_id": _INT}
_U32 = {"index", "pci_device_id", "pci_subsystem_id", "minor_number", "power_mw",
        "temperature_c", "pid", "gpu_instance_id", "compute_instance_id", "cuda_driver_version"}
_RANGES = {"utilization_gpu": 100, "utilization_memory": 100, "mig_mode": 1, "mig_pending": 1,
           "index": 63}
_PCI_RE = re.compile(r"(?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{1,2}:([0-9a-fA-F]{1,2})\.[0-7]")
_EVENT = {"gpu": _INT, "type": "type", "data": _INT, "seq": _INT, "gpu_instance_id": _INT,
          "compute_instance_id": _INT}


def _is_kind(value: Any, kind: Any) -> bool:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind == _INT:
        return is_int and value >= 0
    if kind == _INT_OR_NULL:
        return value is None or is_int
    if kind == _STR:
        return isinstance(value, str)
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind is list:
        return isinstance(value, list)
    return (isinstance(value, str) and value in EVENT_TYPES) or (is_int and value > 0)


def _check_obj(obj: Any, spec: Mapping[str, Any], where: str,
               required: tuple[str, ...] = ()) -> None:
    if not isinstance(obj, Mapping):
        raise ValueError(f"{where}: expected an object")
    for key, value in obj.items():
        if not isinstance(key, str):
            raise ValueError(f"{where}: key {key!r} is not a string")
        if key.startswith("_"):
            continue
        if key not in spec:
            raise ValueError(f"{where}: unknown key {key!r} (allowed: {', '.join(spec)})")
        kind = spec[key]
        if not _is_kind(value, kind):
            raise ValueError(f"{where}.{key}: {value!r} is not a valid {kind}")
        if isinstance(value, int) and kind in (_INT, _INT_OR_NULL):
            top = _RANGES.get(key, 0xFFFFFFFF if key in _U32 else (1 << 63) - 1)
            if value > top or (key == "numa_node" and value < -1):
                raise ValueError(f"{where}.{key}: {value} is out of range")
    for key in required:
        if key not in obj:
            raise ValueError(f"{where}: needs {key!r}")


def validate_state(state: Mapping[str, Any]) -> None:
    """Raise ValueError where `state` would not be accepted by the library."""
    _check_obj(state, _TOP, "state")
    if len(state.get("driver_version", "").encode()) > 79:
        raise ValueError("driver_version: longer than 79 bytes")
    gpus = state.get("gpus", [])
    for i, gpu in enumerate(gpus):
        _check_obj(gpu, _GPU, f"gpus[{i}]")
        for k, proc in enumerate(gpu.get("processes", [])):
            _check_obj(proc, _PROC, f"gpus[{i}].processes[{k}]", required=("pid",))
        bus_id = gpu.get("pci_bus_id", "0:0:0.0")
        m = _PCI_RE.fullmatch(bus_id)
        if not m or int(m[1], 16) > 0x1F:
            raise ValueError(f"gpus[{i}].pci_bus_id: {bus_id!r} is not DOMAIN:BUS:DEVICE.FN")
        for key, limit in (("uuid", 95), ("name", 95)):
            if len(gpu.get(key, "").encode()) > limit:
                raise ValueError(f"gpus[{i}].{key}: longer than {limit} bytes")
        if gpu.get("memory_used", 0) > gpu.get("memory_total", 85520809984):
            raise ValueError(f"gpus[{i}]: memory_used exceeds memory_total")
    n = len(gpus)
    indices = sorted(gpu.get("index", i) for i, gpu in enumerate(gpus))
    if indices != list(range(n)):
        raise ValueError(f"gpu indices must be 0..{n - 1}, got {indices}")
    topology = state.get("topology")
    if topology is not None:
        if len(topology) != n or any(not isinstance(r, list) or len(r) != n for r in topology):
            raise ValueError(f"topology must be a {n} x {n} matrix")
        for row in topology:
            for level in row:
                if level not in (0, 10, 20, 30, 40, 50) or isinstance(level, bool):
                    raise ValueError(f"topology: {level!r} is not a level 0, 10, ..., 50")
    for pair in state.get("nvlink", []):
        if (not isinstance(pair, list) or len(pair) != 2 or pair[0] == pair[1]
                or any(not isinstance(x, int) or not 0 <= x < n for x in pair)):
            raise ValueError(f"nvlink: {pair!r} is not a pair of distinct GPU indices")
    seen = set()
    for k, event in enumerate(state.get("events", [])):
        _check_obj(event, _EVENT, f"events[{k}]", required=("gpu", "type", "seq"))
        if event["gpu"] >= n:
            raise ValueError(f"events[{k}].gpu: no GPU {event['gpu']}")
        key = (event["gpu"], event["seq"])
        if key in seen:
            raise ValueError(f"events[{k}]: gpu {key[0]} has seq {key[1]} twice")
        seen.add(key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.nvml_standin.build",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", nargs="?", type=Path,
                        default=Path(tempfile.gettempdir()) / "noduslocal-nvml-standin")
    parser.add_argument("--sample-state", type=Path, help="also write sample_state() here")
    parser.add_argument("--gpus", type=int, default=2, help="GPUs in the sample state")
    args = parser.parse_args(argv)
    lib = build(args.out_dir)
    print(lib)
    if args.sample_state:
        write_state(args.sample_state, sample_state(args.gpus))
        print(f"{STATE_ENV}={args.sample_state}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
