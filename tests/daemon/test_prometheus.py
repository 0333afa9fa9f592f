"""Issue 13, item 5: Prometheus text at /metrics on the socket, and on the optional
127.0.0.1 port, parsed with prometheus-client's own parser; its job counts match
`job list`, and the TCP port serves /metrics alone."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from noduslocal import testing
from noduslocal.sdk import wire
from tests.conftest import run_cli


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


PORT = free_port()


@pytest.fixture
def box() -> Iterator[testing.Daemon]:
    d = testing.Daemon(cpus=1, memory="2GiB",
                       config=f'simulate_gpus = "2xL4"\nmetrics_port = {PORT}\n')
    try:
        yield d.start()
    finally:
        d.close()


def scrape(d: testing.Daemon) -> dict[str, list[tuple[dict[str, str], float]]]:
    conn = wire.Connection(str(d.socket), 10)
    try:
        conn.send("GET", "/metrics", {})
        resp = conn.response("GET")
        assert resp.status == 200
        assert resp.header("Content-Type", ).startswith("text/plain")  # type: ignore[union-attr]
        text = resp.read().decode()
    finally:
        conn.close()
    return samples(text)


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def value(found: dict[str, list[tuple[dict[str, str], float]]], name: str,
          **labels: str) -> float:
    return sum(v for have, v in found.get(name, [])
               if all(have.get(k) == want for k, want in labels.items()))


def test_metrics_parse_and_match_job_list(box: testing.Daemon) -> None:
    d = box
    client = d.client()
    client.wait_job(client.create_job({"name": "ok", "command": ["true"]})["name"])
    client.wait_job(client.create_job({"name": "bad", "command": ["false"]})["name"])
    client.create_job({"name": "runs", "command": ["sleep", "60"], "gpu": "1"})
    testing.wait_until(lambda: client.get_job("runs")["phase"] == "Running", "runs")
    client.create_job({"name": "waits", "command": ["true"]})  # the one CPU is taken
    assert run_cli(d, "gpus", "drain", "1").returncode == 0
    listed = json.loads(run_cli(d, "job", "list", "-a", "--json").stdout)
    found = scrape(d)
    for phase in ("Pending", "Running", "Succeeded", "Failed", "Cancelled"):
        assert value(found, "noduslocal_jobs", phase=phase) == \
            sum(1 for j in listed if j["phase"] == phase), phase
    assert value(found, "noduslocal_queue_length", user="root") == 1
    assert value(found, "noduslocal_gpu_state", gpu="0", state="allocated") == 1
    assert value(found, "noduslocal_gpu_state", gpu="1", state="drained") == 1
    assert value(found, "noduslocal_gpu_state", state="free") == 0
    assert value(found, "noduslocal_gpu_memory_total_bytes", gpu="0") == 24 * 2**30
    assert value(found, "noduslocal_attempts_total", phase="Exited", reason="Completed") == 1
    assert value(found, "noduslocal_attempts_total", phase="Exited", reason="Error") == 1
    assert value(found, "noduslocal_api_request_seconds_count", method="POST",
                 route="/v1/jobs") == 4
    # A long poll is no latency: waits are left out, as streams are.
    assert value(found, "noduslocal_api_request_seconds_count",
                 route="/v1/jobs/{name}/wait") == 0
    assert value(found, "noduslocal_disk_free_bytes") > 0
    run_cli(d, "du")  # measured now: the scrape shows what du shows
    found = scrape(d)
    assert value(found, "noduslocal_user_disk_bytes", user="root", kind="workspaces") > 0
    assert value(found, "noduslocal_user_disk_bytes", user="root", kind="volumes") == 0


def test_the_tcp_port_serves_metrics_alone(box: testing.Daemon) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=10) as resp:
        found = samples(resp.read().decode())
    assert "noduslocal_jobs" in found and "noduslocal_disk_free_bytes" in found
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{PORT}/v1/jobs", timeout=10)
    assert refused.value.code == 404
