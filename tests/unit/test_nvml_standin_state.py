"""The stand-in NVML's state file (tests/nvml_standin), written without the library: its
schema is checked and each write is atomic. The library itself, as pynvml sees it, is
tested in tests/system/test_nvml_standin.py (it is compiled with gcc)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.nvml_standin import build as standin

GiB = 1 << 30


def gpu(i: int, **fields: Any) -> dict[str, Any]:
    return {"index": i, "uuid": f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd",
            "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{0x17 + i:02X}:00.0",
            "memory_total": 80 * GiB, "memory_used": 0, "utilization_gpu": 0,
            "utilization_memory": 0, "power_mw": 70000, "energy_mj": 0, "mig_mode": 0,
            "numa_node": 0, "processes": [], "missing": False, **fields}


def test_write_state_checks_the_schema_and_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    standin.write_state(path, standin.sample_state(4))
    standin.write_state(path, {"gpus": [gpu(0)], "_comment": "ignored"})
    assert json.loads(path.read_text())["gpus"][0]["uuid"].startswith("GPU-00000000")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    for bad in ({"gpus": [gpu(0, memory_use=1)]},
                {"gpu": []},
                {"gpus": [gpu(0), gpu(2)]},
                {"gpus": [gpu(0, processes=[{"used_memory": 1}])]},
                {"gpus": [gpu(0)], "topology": [[0, 10]]},
                {"gpus": [gpu(0), gpu(1)], "nvlink": [[0, 0]]},
                {"gpus": [gpu(0)], "events": [{"gpu": 0, "type": "xyz", "seq": 1}]},
                {"gpus": [gpu(0)], "events": [{"gpu": 1, "type": "xid", "seq": 1}]},
                {"gpus": [gpu(0, missing="yes")]},
                {"gpus": [gpu(0, mig_mode=2)]},
                {"gpus": [gpu(0, pci_bus_id="17:00")]},
                {"gpus": [gpu(0, utilization_gpu=101)]},
                {"gpus": [gpu(0, power_mw=1 << 32)]},
                {"gpus": [gpu(0, memory_used=81 * GiB)]}):
        with pytest.raises(ValueError):
            standin.write_state(path, bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
