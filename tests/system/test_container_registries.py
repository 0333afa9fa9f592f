"""An image's registry on this host, through a real daemon and real docker: refused unless
the admin lists it (dockerd, as root, would contact it for the user), and an allowed one's
answer stays out of the job's message. Webhooks are in tests/daemon/test_outbound_requests.py."""

from __future__ import annotations

from typing import Any

from noduslocal import testing
from tests.conftest import run_cli
from tests.daemon.test_outbound_requests import SECRET, Listener, listener  # noqa: F401


def ended(c: Any, name: str) -> dict[str, Any]:
    return c.wait_job(name, timeout=120)


def test_a_registry_on_this_host_is_refused_by_default(docker_client: Any,
                                                       listener: Listener) -> None:  # noqa: F811
    with testing.daemon(cpus=2, memory="8GiB") as d:
        c = d.client()
        for name, host in (("probe", "127.0.0.1"), ("named", "localhost")):
            image = f"{host}:{listener.port}/probe/x:1"
            c.create_job({"name": name, "image": image, "command": ["true"]})
            job = ended(c, name)
            assert job["phase"] == "Failed" and job["reason"] == "StartFailed", job
            assert image in job["message"] and "local_registries" in job["message"], job
            assert "loopback" in job["message"], job
        assert listener.paths == []  # dockerd was never asked to contact it


def test_an_allowed_local_registrys_answer_stays_out_of_the_message(
        docker_client: Any, listener: Listener) -> None:  # noqa: F811
    config = f'local_registries = ["127.0.0.1:{listener.port}"]\n'
    with testing.daemon(cpus=2, memory="8GiB", config=config) as d:
        c = d.client()
        image = f"127.0.0.1:{listener.port}/probe/x:1"
        c.create_job({"name": "pulled", "image": image, "command": ["true"]})
        job = ended(c, "pulled")
        assert job["phase"] == "Failed" and job["reason"] == "StartFailed", job
        assert listener.paths, "dockerd contacted the allowed registry"
        assert image in job["message"] and SECRET not in job["message"], job
        assert SECRET in d.log()  # the detail is the admin's, in the daemon's log
        status = run_cli(d, "job", "status", "pulled")
        assert SECRET not in status.stdout + status.stderr
