"""Parsing and validation of what crosses the socket: durations, sizes, CPUs, names, image
references (docker's grammar, and the registry docker reads in one), and the create body,
which must be refused completely before anything is written."""

from __future__ import annotations

import pytest

from noduslocal.domain import errors
from noduslocal.domain.units import parse_cpu, parse_duration, parse_size
from noduslocal.domain.validation import JOB_CREATE_FIELDS, parse_create, validate_name

REGIONS = ("local",)


@pytest.mark.parametrize(("text", "seconds"), [
    (90, 90.0), ("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("2h", 7200.0),
    ("1h30m", 5400.0), ("1d", 86400.0), (0.5, 0.5), ("250ms", 0.25),
])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text, "timeout") == seconds


@pytest.mark.parametrize("bad", ["", "abc", "5x", "-3", 0, -1, True, None, "m", "1h3x", "h1"])
def test_bad_durations_name_the_field(bad: object) -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        parse_duration(bad, "timeout")
    assert info.value.field == "timeout"
    assert "timeout" in info.value.message


@pytest.mark.parametrize(("text", "size"), [
    (1048576, 1048576), ("512M", 512 * 2**20), ("512MiB", 512 * 2**20), ("4G", 4 * 2**30),
    ("4GiB", 4 * 2**30), ("4gb", 4 * 2**30), ("100B", 100), ("1.5K", 1536),
])
def test_sizes(text: object, size: int) -> None:
    assert parse_size(text, "memory") == size


@pytest.mark.parametrize("bad", ["", "lots", "4X", "-1G", 0, True, "iB", 1.5, "16", "100"])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(errors.InvalidArgument, match="memory"):
        parse_size(bad, "memory")


@pytest.mark.parametrize(("text", "millis"), [(1, 1000), (2, 2000), (0.5, 500), ("2", 2000),
                                              ("500m", 500), ("1.25", 1250)])
def test_cpus(text: object, millis: int) -> None:
    assert parse_cpu(text) == millis


@pytest.mark.parametrize("bad", [0, -1, "0m", "two", True, "1.5m"])
def test_bad_cpus(bad: object) -> None:
    with pytest.raises(errors.InvalidArgument, match="cpu"):
        parse_cpu(bad)


@pytest.mark.parametrize("good", ["a", "job-1", "x" * 63, "0abc"])
def test_good_names(good: str) -> None:
    assert validate_name(good, "name") == good


@pytest.mark.parametrize("bad", ["", "A", "-a", "a-", "a_b", "a.b", "x" * 64, "é", 5, None])
def test_bad_names(bad: object) -> None:
    with pytest.raises(errors.InvalidArgument, match="name"):
        validate_name(bad, "name")


def test_create_minimal_defaults() -> None:
    req = parse_create({"command": ["true"]}, regions=REGIONS)
    assert req.spec.argv == ["true"]
    assert req.spec.cpu_m == 1000
    assert req.spec.memory is None
    assert req.spec.retries == 0
    assert req.name is None and req.project is None and req.labels == {}


def test_create_full() -> None:
    req = parse_create({
        "name": "train", "project": "lab", "command": ["python"], "args": ["x.py", "--lr", "3"],
        "env": {"A_1": "x"}, "cpu": "500m", "memory": "1GiB", "workdir": "/tmp",
        "timeout": "15m", "retries": 2, "labels": {"team": "nlp"}, "region": "local",
    }, regions=REGIONS)
    assert req.spec.argv == ["python", "x.py", "--lr", "3"]
    assert (req.spec.cpu_m, req.spec.memory, req.spec.timeout) == (500, 2**30, 900.0)
    assert req.labels == {"team": "nlp"} and req.name == "train" and req.project == "lab"


@pytest.mark.parametrize(("body", "field"), [
    ({"command": ["true"], "bogus": 1}, "bogus"),
    ({"command": []}, "command"),
    ({}, "command"),
    ({"command": [""]}, "command"),
    ({"command": "true"}, "command"),
    ({"command": ["true", 3]}, "command"),
    ({"command": ["true"], "env": {"1BAD": "x"}}, "env"),
    ({"command": ["true"], "env": {"A-B": "x"}}, "env"),
    ({"command": ["true"], "env": {"A": 1}}, "env"),
    ({"command": ["true"], "env": ["A=1"]}, "env"),
    ({"command": ["true"], "name": "Bad_Name"}, "name"),
    ({"command": ["true"], "region": "us-east1"}, "region"),
    ({"command": ["true"], "workdir": "relative"}, "workdir"),
    ({"command": ["true"], "retries": -1}, "retries"),
    ({"command": ["true"], "retries": "2"}, "retries"),
    ({"command": ["true"], "labels": {"k": "v" * 64}}, "labels"),
    ({"command": ["true"], "timeout": "soon"}, "timeout"),
])
def test_create_refusals_name_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        parse_create(body, regions=REGIONS)
    assert info.value.field == field
    assert "\n" not in info.value.message


def test_region_error_lists_valid_regions() -> None:
    with pytest.raises(errors.InvalidArgument, match="valid: local"):
        parse_create({"command": ["true"], "region": "eu"}, regions=REGIONS)


@pytest.mark.parametrize(("field", "value"), [("interruptible", False), ("completions", 1),
                                              ("gpu", None), ("outputs", {})])
def test_neutral_values_make_an_ordinary_job(field: str, value: object) -> None:
    spec = parse_create({"command": ["true"], field: value}, regions=REGIONS).spec
    assert spec.indexed is None and spec.gang is None


def test_counts_are_type_exact() -> None:
    # True == 1 in Python; True completions must not slip through as "1".
    with pytest.raises(errors.InvalidArgument) as info:
        parse_create({"command": ["true"], "completions": True}, regions=REGIONS)
    assert info.value.field == "completions"


def test_create_fields_cover_the_reference_signature() -> None:
    import inspect

    from noduslocal.sdk.job import Job

    # `export` is the client's: it picks which of the caller's variables go into `env`
    sdk = set(inspect.signature(Job.create).parameters) - {"export"}
    assert sdk <= JOB_CREATE_FIELDS
    # The CLI and API's own, and project.job's (the SDK mirrors)
    assert JOB_CREATE_FIELDS - sdk == {"retries", "priority", "ephemeral"}


@pytest.mark.parametrize("huge", [10**400, "100000000h", 1e308])
def test_huge_durations_are_refused_not_a_500(huge: object) -> None:
    with pytest.raises(errors.InvalidArgument, match="at most 10 years"):
        parse_duration(huge, "timeout")


# A host job's checkpoint and volumes follow a container's rules (issue 25 part 3: a host
# job has a mount namespace of its own): "/ckpt" was refused ("under /workspace"), and
# paths were kept workspace-relative; now they are absolute, "/ckpt" taken.
@pytest.mark.parametrize(("value", "message"), [
    ("../x", "'..'"), ("/workspace", "would cover the workspace"), ("/", "whole file system"),
    ("/proc/x", "may not be covered"), (3, "expected a path"),
    ({"path": "x", "extra": 1}, "expected a path or"),
])
def test_bad_checkpoints(value: object, message: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=message) as info:
        parse_create({"command": ["true"], "checkpoint": value}, regions=REGIONS)
    assert info.value.field == "checkpoint"


def test_checkpoint_forms() -> None:
    for value in ("/workspace/ckpt/a", "ckpt/a", {"path": "./ckpt/a"}):
        assert parse_create({"command": ["true"], "checkpoint": value},
                            regions=REGIONS).spec.checkpoint == "/workspace/ckpt/a"
    for image in (None, "busybox"):  # one rule for both runtimes
        assert parse_create({"command": ["true"], "checkpoint": "/ckpt", "image": image},
                            regions=REGIONS).spec.checkpoint == "/ckpt"


def test_a_host_jobs_volumes_may_be_anywhere_a_containers_may() -> None:
    spec = parse_create({"command": ["true"], "volumes": {"/results": "results",
                                                          "data": "d"}},
                        regions=REGIONS).spec
    assert spec.volumes == {"/results": "results", "/workspace/data": "d"}


def test_an_older_daemons_workspace_relative_paths_read_as_under_workspace() -> None:
    from noduslocal.domain.jobs import JobSpec

    spec = JobSpec.from_stored({"command": ["true"], "checkpoint": "ckpt",
                                "volumes": {"out/r": "r"}})
    assert (spec.checkpoint, spec.volumes) == ("/workspace/ckpt", {"/workspace/out/r": "r"})


GOOD_IMAGES = ["python:3.11", "ghcr.io/org/train:v2", "registry.example.com:5000/a/b:1",
               "noduslocal-test/busybox:1", "library/busybox", "a__b/c.d-e---f",
               "busybox@sha256:" + "0" * 64, "busybox:1.36@sha256:" + "f" * 64,
               "Registry.Example.com/team/x", "a" * 64, "sha256:" + "0" * 64]


@pytest.mark.parametrize("image", GOOD_IMAGES)
def test_an_image_reference_in_dockers_grammar_is_taken(image: str) -> None:
    assert parse_create({"image": image}, regions=("local",)).spec.image == image


def test_the_registry_of_an_image_reference_is_read_as_docker_reads_it() -> None:
    from noduslocal.domain.container_fields import registry_of

    assert [registry_of(image) for image in (
        "python:3.11", "org/train:v2", "ghcr.io/org/train:v2", "localhost/x",
        "127.0.0.1:5000/x@sha256:" + "0" * 64, "MyHost/x:1", "localhost:5000")] == [
        None, None, "ghcr.io", "localhost", "127.0.0.1:5000", "myhost", None]


def test_arguments_and_environment_over_what_a_process_takes_are_refused() -> None:
    """The API's body limit (1 MiB) is below it; the SDK's own checks are not."""
    from noduslocal.domain import errors
    from noduslocal.domain.validation import parse_create

    with pytest.raises(errors.InvalidArgument, match=r"take .* bytes together") as refused:
        parse_create({"command": ["echo"], "args": ["y" * 100_000] * 12}, regions=("local",))
    assert refused.value.field == "args"
