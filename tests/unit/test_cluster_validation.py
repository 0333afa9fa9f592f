"""A job or a sweep cell bound for a cluster region (a Slurm runtime) at create: what the
cluster cannot run (image, volumes, checkpoint, disk, max_cost, a gang's transport, a
GPU's memory) is refused with one line naming the field and the region, whether the body, its
profile or a sweep's grid asks for it; a plain command with its resources is taken, and
this box's region is stored as None."""

from __future__ import annotations

from typing import Any

import pytest

from noduslocal.domain import errors
from noduslocal.domain.gpu_request import GpuRequest
from noduslocal.domain.sweep_plan import parse_sweep
from noduslocal.domain.validation import CLUSTER_REFUSED, parse_create

REGIONS = ("local", "cluster")
PLAIN = {"command": ["python", "train.py"]}


def refused(body: dict[str, Any], profiles: dict[str, Any] | None = None
            ) -> errors.InvalidArgument:
    with pytest.raises(errors.InvalidArgument) as caught:
        parse_create(body, regions=REGIONS, profiles=profiles)
    assert "\n" not in caught.value.message
    return caught.value


# One value of each field a cluster refuses, each one a local job may have.
REFUSED_IN_CLUSTER: list[tuple[str, Any]] = [
    ("image", "python:3.11"),
    ("volumes", {"/data": "shared-set"}),
    ("checkpoint", "/workspace/ckpt"),
    ("checkpoint", {"path": "/ckpt", "volume": "ckpts"}),
    ("disk", "10GiB"),
    ("max_cost", 5.0),
]


@pytest.mark.parametrize(("field", "value"), REFUSED_IN_CLUSTER)
def test_what_a_cluster_cannot_run_is_refused_naming_field_and_region(
        field: str, value: Any) -> None:
    body = {**PLAIN, field: value}
    error = refused({**body, "region": "cluster"})
    assert type(error) is errors.Unsupported
    assert error.field == field
    assert error.message.startswith(f"{field}: ") and "'cluster'" in error.message
    assert CLUSTER_REFUSED[field] in error.message  # and why
    if field not in ("volumes", "checkpoint"):  # a volume must exist: the daemon's check
        assert parse_create({**body, "region": "local"}, regions=REGIONS).spec.region is None


def test_an_indexed_job_runs_in_a_cluster_as_on_this_box() -> None:
    """An indexed job is one Slurm job array there; its outputs still name their index."""
    spec = parse_create({**PLAIN, "region": "cluster", "completions": 8, "parallelism": 2,
                         "gpu": "2"}, regions=REGIONS).spec
    assert spec.indexed is not None and spec.region == "cluster"
    assert (spec.indexed.completions, spec.indexed.parallelism) == (8, 2)
    assert spec.gpu is not None and spec.gpu.count == 4  # two indexes' GPUs together
    error = refused({**PLAIN, "region": "cluster", "completions": 3,
                     "outputs": {"model": "out/model.pt"}})
    assert error.field == "outputs.model"


def test_a_gang_runs_in_a_cluster_but_not_with_one_host_s_transport() -> None:
    """A gang is one Slurm job over N nodes; the transports are NCCL settings for one host."""
    for gang in ({"nodes": 2}, {"nodes": 2, "gpus_per_node": 1, "launcher": "Torchrun"}):
        spec = parse_create({**PLAIN, "region": "cluster", "distributed": gang},
                            regions=REGIONS).spec
        assert spec.gang is not None and spec.gang.nodes == 2 and spec.region == "cluster"
    error = refused({**PLAIN, "region": "cluster",
                     "distributed": {"nodes": 2, "transport": "tcp"}})
    assert type(error) is errors.Unsupported and error.field == "distributed.transport"
    assert "'cluster'" in error.message


def test_a_gpus_memory_is_refused_in_a_cluster() -> None:
    error = refused({**PLAIN, "region": "cluster",
                     "gpu": {"type": "H100", "count": 1, "min_memory": "40GiB"}})
    assert type(error) is errors.Unsupported
    assert error.field == "gpu" and "'cluster'" in error.message
    assert "memory" in error.message and "gpu_types" in error.message


@pytest.mark.parametrize("gpu", [1, "H100", "H100:2", "2xL4", "gpu_2x_h100",
                                 {"type": "H100", "count": 2}])
def test_a_gpu_model_and_count_are_taken_in_a_cluster(gpu: Any) -> None:
    spec = parse_create({**PLAIN, "region": "cluster", "gpu": gpu}, regions=REGIONS).spec
    assert spec.gpu is not None and spec.gpu.min_memory is None


def test_a_plain_command_with_its_resources_runs_in_a_cluster() -> None:
    request = parse_create({**PLAIN, "region": "cluster", "cpu": "4", "memory": "8GiB",
                            "gpu": "H100:2", "timeout": "2h", "env": {"A": "1"},
                            "retries": 3, "name": "train-1", "labels": {"k": "v"}},
                           regions=REGIONS)
    spec = request.spec
    assert spec.region == "cluster"
    assert spec.command == ["python", "train.py"]
    assert spec.cpu_m == 4000 and spec.memory == 8 * 2**30 and spec.timeout == 7200.0
    assert spec.gpu == GpuRequest(2, "H100")
    assert spec.retries == 3 and spec.env == {"A": "1"}
    assert spec.image is None and spec.volumes == {} and spec.disk is None
    assert spec.gang is None and spec.indexed is None and spec.checkpoint is None
    assert request.name == "train-1"


def test_null_and_empty_refused_fields_are_no_request() -> None:
    """A raw API body may send every field, null or empty: that asks for nothing."""
    spec = parse_create({**PLAIN, "region": "cluster", "image": None, "volumes": {},
                         "checkpoint": None, "disk": None, "completions": None,
                         "parallelism": None, "distributed": None, "gpu": None},
                        regions=REGIONS).spec
    assert spec.region == "cluster" and spec.image is None and spec.gpu is None


def test_an_unknown_region_is_refused_listing_the_known_ones() -> None:
    error = refused({**PLAIN, "region": "mars"})
    assert type(error) is errors.InvalidArgument
    assert error.field == "region" and "'mars'" in error.message
    assert "valid: local, cluster" in error.message


@pytest.mark.parametrize("body", [PLAIN, {**PLAIN, "region": "local"},
                                  {**PLAIN, "region": None}])
def test_this_boxs_region_is_stored_as_none(body: dict[str, Any]) -> None:
    assert parse_create(body, regions=REGIONS).spec.region is None


def test_this_box_is_the_first_region_whatever_its_name() -> None:
    regions = ("box", "cluster")
    assert parse_create({**PLAIN, "region": "box", "image": "python:3.11"},
                        regions=regions).spec.region is None
    with pytest.raises(errors.Unsupported, match="image: not in region 'cluster'"):
        parse_create({**PLAIN, "region": "cluster", "image": "python:3.11"}, regions=regions)
    with pytest.raises(errors.InvalidArgument, match="valid: box, cluster"):
        parse_create({**PLAIN, "region": "local"}, regions=regions)


def test_a_profiles_image_is_refused_in_a_cluster() -> None:
    profiles = {"torch": {"image": "pytorch/pytorch:2.3.0", "cpu": "2"},
                "slurm-torch": {"region": "cluster", "image": "pytorch/pytorch:2.3.0"},
                "slurm": {"region": "cluster", "cpu": "8"}}
    error = refused({**PLAIN, "region": "cluster", "profile": "torch"}, profiles)
    assert type(error) is errors.Unsupported and error.field == "image"
    error = refused({**PLAIN, "profile": "slurm-torch"}, profiles)
    assert type(error) is errors.Unsupported and "'cluster'" in error.message
    spec = parse_create({**PLAIN, "profile": "slurm"}, regions=REGIONS, profiles=profiles).spec
    assert spec.region == "cluster" and spec.cpu_m == 8000
    # The body's own region wins over its profile's.
    assert parse_create({**PLAIN, "profile": "slurm-torch", "region": "local"},
                        regions=REGIONS, profiles=profiles).spec.region is None


# --- sweeps -------------------------------------------------------------------------------

def sweep(body: dict[str, Any], profiles: dict[str, Any] | None = None) -> Any:
    return parse_sweep(body, regions=REGIONS, profiles=profiles)


def sweep_refused(body: dict[str, Any], profiles: dict[str, Any] | None = None
                  ) -> errors.InvalidArgument:
    with pytest.raises(errors.InvalidArgument) as caught:
        sweep(body, profiles)
    assert "\n" not in caught.value.message
    return caught.value


def test_a_grid_over_regions_puts_each_cell_in_its_region() -> None:
    plan = sweep({"template": PLAIN, "grid": {"region": ["local", "cluster"],
                                              "lr": ["0.1", "0.01"]}})
    assert len(plan) == 4
    cells = [plan.cell_spec(i, "s") for i in range(4)]
    placed = {(spec.region, spec.env["lr"]) for spec in cells}
    assert placed == {(None, "0.1"), (None, "0.01"), ("cluster", "0.1"), ("cluster", "0.01")}
    for index, spec in enumerate(cells):
        want = plan.grid.params(index)["region"]
        assert spec.region == (None if want == "local" else want)
        assert "region" not in spec.env  # a resource, not a variable
    assert plan.cell_regions() == {None, "cluster"}
    assert plan.template.spec.region is None


def test_a_grid_of_one_cluster_region_and_a_template_region() -> None:
    assert sweep({"template": PLAIN, "grid": {"region": ["cluster"], "k": ["1"]}}
                 ).cell_regions() == {"cluster"}
    plan = sweep({"template": {**PLAIN, "region": "cluster"}, "grid": {"k": ["1", "2"]}})
    assert plan.cell_regions() == {"cluster"}
    assert {plan.cell_spec(i, "s").region for i in range(2)} == {"cluster"}
    mapped = sweep({"template": {**PLAIN, "region": "cluster"},
                    "map": {"args": ["echo", "{}"], "lines": ["a", "b"]}})
    assert {mapped.cell_spec(i, "s").region for i in range(2)} == {"cluster"}


@pytest.mark.parametrize(("field", "value"), [
    ("image", "python:3.11"), ("disk", "10GiB"), ("checkpoint", "/workspace/ckpt"),
    ("max_cost", 4.0),
])
def test_a_template_field_a_cluster_refuses_fails_the_sweep_at_create(
        field: str, value: Any) -> None:
    template = {**PLAIN, field: value}
    error = sweep_refused({"template": template,
                           "grid": {"region": ["local", "cluster"], "lr": ["0.1"]}})
    assert type(error) is errors.Unsupported
    assert error.field == field and "'cluster'" in error.message
    # The same template on this box alone is a sweep.
    assert len(sweep({"template": template, "grid": {"region": ["local"], "lr": ["0.1"]}})) == 1


def test_a_templates_gpu_memory_fails_a_sweep_with_cluster_cells() -> None:
    error = sweep_refused({"template": {**PLAIN, "gpu": {"count": 1, "min_memory": "40GiB"}},
                           "grid": {"region": ["local", "cluster"]}})
    assert type(error) is errors.Unsupported and error.field == "gpu"
    assert "'cluster'" in error.message


def test_an_unknown_region_in_the_grid_is_refused() -> None:
    error = sweep_refused({"template": PLAIN, "grid": {"region": ["local", "mars"]}})
    assert error.field == "grid.region" and "'mars'" in error.message
    assert "local, cluster" in error.message


def test_a_profiles_image_fails_a_sweep_with_cluster_cells() -> None:
    """The template's profile fills its image in every cell, the cluster's too: refused at
    create as the template's own image is, not left for the cell to run without it."""
    profiles = {"torch": {"image": "pytorch/pytorch:2.3.0"}}
    error = sweep_refused({"template": {**PLAIN, "profile": "torch"},
                           "grid": {"region": ["local", "cluster"]}}, profiles)
    assert type(error) is errors.Unsupported
    assert error.field == "image" and "'cluster'" in error.message


def test_a_grid_gpu_with_memory_fails_a_sweep_with_cluster_cells() -> None:
    """A grid's GPU value is the cell's GPU request: one with min_memory in a cluster cell
    is refused as the same request in the template is."""
    error = sweep_refused({"template": PLAIN,
                           "grid": {"region": ["cluster"],
                                    "gpu": [{"count": 1, "min_memory": "40GiB"}]}})
    assert type(error) is errors.Unsupported
    assert error.field == "grid.gpu" and "'cluster'" in error.message
    error = sweep_refused({"template": {**PLAIN, "region": "cluster"},
                           "grid": {"gpu": ["H100", {"count": 1, "min_memory": "40GiB"}]}})
    assert type(error) is errors.Unsupported and error.field == "grid.gpu"


def test_a_sweep_budget_is_refused_when_cells_run_in_a_cluster() -> None:
    """Their cost is not metered here: the budget would never see them."""
    error = sweep_refused({"template": PLAIN, "max_cost": 10.0,
                           "grid": {"region": ["local", "cluster"]}})
    assert type(error) is errors.Unsupported and error.field == "max_cost"
    assert "'cluster'" in error.message
    assert len(sweep({"template": PLAIN, "max_cost": 10.0, "grid": {"region": ["local"]}})) == 1
