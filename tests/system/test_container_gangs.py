"""Gangs of containers through a real daemon and real docker: the ranks meet on the gang's
own docker network, which goes with them, and a gang that starts too late leaves no
container or network behind. Host gangs are in tests/daemon/test_gangs.py."""

from __future__ import annotations

from typing import Any

from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.runtime.docker.spec import LABEL, instance_id, job_filter
from noduslocal.testing import wait_until
from tests.conftest import PYTHON_IMAGE
from tests.daemon.test_gangs import ENV_LINE, RENDEZVOUS, env_of, gang_daemon, gang_id, log_of


def test_container_gang_meets_on_its_own_network_which_goes_with_it(
        docker_client: Any) -> None:
    script = "import os\n" + ENV_LINE + RENDEZVOUS
    with gang_daemon(config=None) as d:
        c = d.client()
        instance = instance_id(d.data_dir)
        c.create_job({"name": "cg", "image": PYTHON_IMAGE, "cpu": "100m",
                      "command": ["python", "-c", script, "0.0.0.0"],
                      "env": {"GATE": "/workspace/go"},
                      "distributed": {"nodes": 2}})
        job_id, number = gang_id(c, "cg")
        wait_until(lambda: "rank 0 got" in log_of(c, "cg", 0), "rank 1 to reach rank 0",
                   timeout=60)
        mine = [f"{LABEL}.instance={instance}", f"{LABEL}.job-id={job_id}"]
        networks = docker_client.networks.list(filters={"label": mine})
        assert [n.name for n in networks] == [f"nodus-gang-{job_id}-{number}-{instance[:8]}"]
        # The low-level listing: docker-py's containers.list() inspects each one it lists,
        # and fails on one removed meanwhile.
        containers = docker_client.api.containers(all=True, filters=job_filter(instance,
                                                                               job_id))
        names = {x["Names"][0].lstrip("/") for x in containers}
        assert names == {f"nodus-{job_id}-{number}-{instance[:8]}",
                         f"nodus-{job_id}-{number}-r1-{instance[:8]}"}, names
        attached = docker_client.networks.get(networks[0].id).attrs["Containers"]
        assert {info["Name"] for info in attached.values()} == names

        (JobLayout(d.data_dir).workspace(job_id) / "go").touch()
        done = c.wait_job("cg", timeout=60)
        assert (done["phase"], done["exit_code"]) == ("Succeeded", 0), done
        logs = {rank: log_of(c, "cg", rank) for rank in (0, 1)}
        assert "rank 0 got: hello from rank 1" in logs[0], logs
        env1 = env_of(logs[1])
        assert env1["MASTER_ADDR"] == f"nodus-{job_id}-{number}-{instance[:8]}", env1
        assert env1["RANK"] == "1" and env1["WORLD_SIZE"] == "2"

        wait_until(lambda: not docker_client.networks.list(filters={"label": mine}),
                   "the gang's network to go")
        wait_until(lambda: not docker_client.api.containers(
            all=True, filters=job_filter(instance, job_id)), "the gang's containers to go")
        assert not [n for n in docker_client.networks.list(names=["nodus-gang-"])
                    if n.name.endswith(instance[:8])]
        # What `job status` shows of the ended gang: each rank's exit, as for host gangs.
        assert [(r["state"], r["exit_code"]) for r in c.get_job("cg")["ranks"]] == [
            ("Exited", 0)] * 2, c.get_job("cg")["ranks"]


def test_a_container_gang_that_starts_late_leaves_no_container_or_network(
        docker_client: Any) -> None:
    with gang_daemon(config=None) as d:
        c = d.client()
        instance = instance_id(d.data_dir)
        c.create_job({"name": "slow", "image": PYTHON_IMAGE, "cpu": "100m",
                      "command": ["sleep", "60"],
                      "distributed": {"nodes": 3, "startup_timeout": 0.01}})
        ended = c.wait_job("slow", timeout=60)
        assert (ended["phase"], ended["reason"]) == ("Failed", "Lost"), ended
        assert "did not start within its startup_timeout" in ended["message"]
        mine = {"label": [f"{LABEL}.instance={instance}"]}
        assert docker_client.api.containers(all=True, filters=mine) == []
        assert docker_client.api.networks(filters=mine) == []
