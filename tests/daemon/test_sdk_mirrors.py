"""The SDK mirrors: Client().map (the type of args picks the combinator) and
Client().project().job (an ephemeral job: its log and volumes stay, its workspace goes)."""

from __future__ import annotations

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors


def test_map_with_a_mapping_is_the_product_of_named_groups(daemon: testing.Daemon) -> None:
    sweep = nodus.Client().map("sh -c 'echo lr={lr} bs={bs}'",
                               args={"lr": ["1e-4", "3e-4"], "bs": [32, "6,4"]},
                               name="mapped")
    canary = sweep.wait_canary(timeout=60)
    assert canary["phase"] in ("Running", "Succeeded")
    status = sweep.wait(timeout=60)
    assert (status["phase"], status["counts"]) == ("Succeeded", {"Succeeded": 4})
    assert [c["params"] for c in sweep.cells()] == [
        {"lr": "1e-4", "bs": "32"}, {"lr": "1e-4", "bs": "6,4"},  # values kept whole
        {"lr": "3e-4", "bs": "32"}, {"lr": "3e-4", "bs": "6,4"}]
    client = daemon.client()
    logs = b"".join(client.logs("mapped-1")).decode()
    assert logs == "lr=1e-4 bs=6,4\n"


def test_map_with_a_list_binds_braces_and_a_list_of_mappings_is_one_task_each(
        daemon: testing.Daemon) -> None:
    shards = nodus.Client().map(["echo", "shard", "{}", "of", "{n}"], args=[0, 1, 2],
                                name="shards", canary=False)
    assert shards.wait(timeout=60)["counts"] == {"Succeeded": 3}
    client = daemon.client()
    assert b"".join(client.logs("shards-2")) == b"shard 2 of 3\n"
    rows = nodus.Client().map("echo {model} {size}", args=[
        {"model": "small", "size": 1}, {"model": "large", "size": 8}], name="rows")
    assert rows.wait(timeout=60)["counts"] == {"Succeeded": 2}
    assert [c["params"] for c in rows.cells()] == [{"model": "small", "size": "1"},
                                                  {"model": "large", "size": "8"}]
    assert b"".join(client.logs("rows-1")) == b"large 8\n"
    with pytest.raises(errors.InvalidArgument, match="every mapping needs the same keys"):
        nodus.Client().map("echo {a}", args=[{"a": 1}, {"b": 2}])
    with pytest.raises(errors.InvalidArgument, match="args: a mapping of lists"):
        nodus.Client().map("echo", args=3)


def test_a_project_job_gives_its_log_and_keeps_only_its_volumes(
        own_daemon: testing.Daemon) -> None:
    daemon = own_daemon  # its own: no job's workspace may be left
    client = daemon.client()
    client.create_volume("results")
    job = nodus.Client().project().job(
        "sh -c 'echo made > results/model.txt; echo scratch > tmp.txt; echo done; exit 3'",
        volume_mounts=[{"name": "results", "mount_path": "results"}], retries=1)
    log = job.wait(timeout=60)
    assert (log.exit_code, log.output) == (3, "done\n")  # a failure does not raise
    assert client.get_job(job.name)["spec"]["ephemeral"] is True
    testing.wait_until(lambda: not any((daemon.data_dir / "jobs").glob("*/workspace")),
                       "the workspace to be discarded")
    assert [f["name"] for f in client.volume_files("results")] == ["model.txt"]
    with pytest.raises(errors.NotFound, match="discarded when the job ended"):
        client.list_files(job.name)
