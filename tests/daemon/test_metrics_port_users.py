"""The metrics TCP port answers any local user, not only the socket's group: with
`metrics_port_per_user = false` it leaves out the series by user (each user's queue and
disk use) and gives the queue's total instead; the socket's /metrics keeps them.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from noduslocal import testing

PER_USER = ("noduslocal_queue_length", "noduslocal_user_disk_bytes")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def samples(text: str) -> dict[str, list[dict[str, str]]]:
    """Each family's samples' labels, by family name."""
    return {family.name: [dict(s.labels) for s in family.samples]
            for family in text_string_to_metric_families(text)}


def scraped(d: testing.Daemon, port: int) -> tuple[str, str]:
    """/metrics from the TCP port and from the socket."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        tcp = resp.read().decode()
    local = b"".join(d.client().transport.stream("/metrics", timeout=30)).decode()
    return tcp, local


def queued(d: testing.Daemon) -> None:
    """A job pending behind another of the same user (user_max_jobs = 1), and a du
    measurement, so that both series by user have a sample."""
    client = d.client()
    client.create_job({"name": "runs", "command": ["sleep", "60"], "cpu": 0.1})
    client.create_job({"name": "waits", "command": ["sleep", "60"], "cpu": 0.1})
    testing.wait_until(lambda: client.get_job("runs")["phase"] == "Running", "runs runs")
    assert client.get_job("waits")["phase"] == "Pending"
    client.transport.request("GET", "/v1/du", query={"refresh": "true"})


def start(per_user: str | None) -> tuple[testing.Daemon, int]:
    port = free_port()
    config = f"metrics_port = {port}\nuser_max_jobs = 1\n"
    if per_user is not None:
        config += f"metrics_port_per_user = {per_user}\n"
    return testing.Daemon(cpus=2, memory="4GiB", config=config).start(), port


@pytest.fixture
def without_users() -> Iterator[tuple[testing.Daemon, int]]:
    d, port = start("false")
    try:
        yield d, port
    finally:
        d.close()


def test_the_tcp_port_can_leave_the_series_by_user_out(
        without_users: tuple[testing.Daemon, int]) -> None:
    d, port = without_users
    queued(d)

    def by_user_on_the_socket() -> bool:
        on_socket = samples(scraped(d, port)[1])
        return {"user": "root"} in on_socket["noduslocal_queue_length"] and any(
            s.get("user") == "root" for s in on_socket.get("noduslocal_user_disk_bytes", []))

    testing.wait_until(by_user_on_the_socket, "the socket's series by user (du measured)")
    tcp, _ = scraped(d, port)
    by_family = samples(tcp)
    assert "noduslocal_user_disk_bytes" not in by_family
    assert by_family["noduslocal_queue_length"] == [{}]  # the total, no user label
    assert "noduslocal_queue_length 1.0" in tcp
    assert not any("user" in labels for family in by_family.values() for labels in family)
    assert "root" not in tcp


def test_by_default_the_tcp_port_has_them() -> None:
    d, port = start(None)
    try:
        queued(d)
        tcp, _ = scraped(d, port)
        assert {"user": "root"} in samples(tcp)["noduslocal_queue_length"]
    finally:
        d.close()


