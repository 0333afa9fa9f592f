"""The sweep spec the sweeps row keeps: typed, written in the row's long-standing JSON form,
and read back to the same value (grid, map with rows, smoke canary, budget)."""

from __future__ import annotations

import json
from dataclasses import replace

from noduslocal.domain.sweep_plan import parse_sweep
from noduslocal.domain.sweeps import SweepSpec


def roundtrip(spec: SweepSpec) -> SweepSpec:
    return SweepSpec.from_wire(json.loads(json.dumps(spec.to_wire())))


def test_a_grid_sweep_keeps_its_row_form_and_reads_back() -> None:
    plan = parse_sweep({"template": {"command": ["train"]},
                        "grid": {"LR": ["1e-4", "3e-4"], "gpu": ["A100", None]},
                        "canary": "none", "max_cost": 3, "webhook": "https://hooks.example/x"},
                       regions=("local",))
    spec = plan.stored()
    wire = spec.to_wire()
    assert list(wire) == ["template", "canary", "webhook", "smoke", "max_cost", "grid", "map"]
    assert wire["grid"] == {"axes": [["LR", ["1e-4", "3e-4"]], ["gpu", ["A100", None]]],
                            "repetitions": 1}
    assert wire["map"] is None and wire["canary"] == "none" and wire["max_cost"] == 3
    back = roundtrip(spec)
    assert back == spec
    assert [back.params(i) for i in range(4)] == [
        {"LR": "1e-4", "gpu": "A100"}, {"LR": "1e-4", "gpu": None},
        {"LR": "3e-4", "gpu": "A100"}, {"LR": "3e-4", "gpu": None}]


def test_a_map_sweep_with_rows_and_a_smoke_canary_reads_back() -> None:
    plan = parse_sweep({"template": {"command": ["x"]},
                        "map": {"command": ["echo", "{a}", "{b}"],
                                "rows": {"names": ["a", "b"],
                                         "values": [["1", "x"], ["2", "y"]]}},
                        "canary_smoke": "true"}, regions=("local",))
    spec = replace(plan.stored(), smoke_job=12)
    wire = spec.to_wire()
    assert wire["smoke_job"] == 12 and wire["canary"] == "smoke"
    assert wire["map"]["command"] == ["echo", "{a}", "{b}"]
    assert wire["map"]["rows"] == [["1", "x"], ["2", "y"]]
    back = roundtrip(spec)
    assert back == spec and back.smoke_job == 12
    assert [back.params(i) for i in range(2)] == [{"a": "1", "b": "x"}, {"a": "2", "b": "y"}]


def test_no_smoke_job_is_written_until_one_is_made() -> None:
    spec = parse_sweep({"template": {"command": ["x"]}, "grid": {"K": ["1"]}},
                       regions=("local",)).stored()
    assert "smoke_job" not in spec.to_wire() and roundtrip(spec).smoke_job is None


def test_each_cell_s_wire_form_is_its_spec_s_key_for_key() -> None:
    """A cell's stored JSON is made from the template's wire form (cell_wire), not from
    a JobSpec built for each cell: for every kind of cell it is cell_spec's to_wire(),
    the same keys in the same order with the same values."""
    regions = ("local", "cluster")
    bodies = [
        {"template": {"command": ["train"], "env": {"K": "v"}, "retries": 2},
         "grid": {"LR": ["1e-4", "3e-4"], "gpu": ["A100", None, {"count": 2}]},
         "repetitions": 2},
        {"template": {"command": ["train"], "region": "cluster"},
         "grid": {"region": ["local", "cluster"], "seed": [1, 2]}},
        {"template": {"command": ["x"], "retries": 1, "args": ["ignored"]},
         "map": {"command": ["echo", "{a}", "{b}"],
                 "rows": {"names": ["a", "b"], "values": [["1", "x"], ["2", "y"]]}}},
        {"template": {"command": ["x"]}, "map": {"args": ["echo", "{}"], "lines": ["a", "b"]}},
    ]
    for body in bodies:
        plan = parse_sweep(body, regions=regions)
        template = plan.template.spec.to_wire()
        for index in range(len(plan)):
            assert json.dumps(plan.cell_wire(index, "s", template)) == json.dumps(
                plan.cell_spec(index, "s").to_wire()), (body, index)
        assert template == plan.template.spec.to_wire()  # left as it was
