"""Requests the daemon makes on a user's behalf, through a real daemon: a sweep's webhook
never follows a redirect and reaches no address of this host (loopback, link-local, its
interfaces') unless the admin allows it, checked at create and again at each post after
DNS resolution. Every listener here is on 127.0.0.1. An image's registry on this host
(docker) is in tests/system/test_container_registries.py."""

from __future__ import annotations

import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from noduslocal import testing
from noduslocal.domain import errors
from tests.conftest import run_cli

ALLOW_LOOPBACK = 'webhook_local_networks = ["127.0.0.1/32"]\n'
SECRET = "registry-secret-body-7f3a"


class Listener(http.server.ThreadingHTTPServer):
    """A loopback HTTP server that records each request's path: POSTs to /redir are
    answered with a 307 to /landed, every GET (a registry's) with a 404 and SECRET."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                listener.paths.append(self.path)
                if self.path.startswith("/redir"):
                    self.send_response(307)
                    self.send_header("Location", "/landed")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                listener.paths.append(self.path)
                body = SECRET.encode()
                self.send_response(404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_HEAD = do_GET

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def one_cell(name: str, webhook: str, command: list[str] | None = None) -> dict[str, Any]:
    """A sweep of one cell whose only webhook call is its end (`completed`)."""
    return {"name": name, "webhook": webhook, "canary": "none", "grid": {"X": ["1"]},
            "template": {"command": command or ["true"], "cpu": "100m"}}


def own_address() -> str | None:
    """An address of this host's that is not loopback (the docker bridge's, eth0's)."""
    try:
        found = subprocess.run(["hostname", "-I"], capture_output=True, text=True,
                               check=False)
    except FileNotFoundError:
        return None
    for address in found.stdout.split():
        if not address.startswith("127.") and ":" not in address:
            return address
    return None


def test_a_webhook_that_redirects_is_not_followed(listener: Listener) -> None:
    with testing.daemon(cpus=2, memory="8GiB", config=ALLOW_LOOPBACK) as d:
        c = d.client()
        c.create_sweep(one_cell("moved", listener.url("/redir?secret")))
        assert c.wait_sweep("moved", timeout=60)["phase"] == "Succeeded"
        testing.wait_until(lambda: "/landed" in listener.paths
                           or "redirects are not followed" in d.log(),
                           "the webhook's redirect followed or refused")
        assert listener.paths == ["/redir?secret"], listener.paths
        assert "answered 307" in d.log()


def test_webhooks_to_this_hosts_addresses_are_refused_by_default(
        daemon: testing.Daemon, listener: Listener) -> None:
    c = daemon.client()
    refused = {
        listener.url(): "loopback",
        listener.url(host="localhost"): "loopback",
        listener.url(host="[::1]"): "loopback",
        listener.url(host="[::ffff:127.0.0.1]"): "loopback",
        listener.url(host="2130706433"): "loopback",  # 127.0.0.1 as one number
        listener.url(host="0.0.0.0"): "unspecified",
        "http://169.254.169.254/latest/meta-data": "link-local",
        "http://[fe80::1]/hook": "link-local",
    }
    if (mine := own_address()) is not None:
        refused[listener.url(host=mine)] = "an address of this host"
    for url, why in refused.items():
        with pytest.raises(errors.InvalidArgument) as caught:
            c.create_sweep(one_cell("near", url))
        assert caught.value.field == "webhook", (url, caught.value)
        assert why in str(caught.value) and "webhook_local_networks" in str(caught.value), \
            (url, str(caught.value))
    nowhere = run_cli(daemon, "map", "--no-code", "--name", "near", "--webhook",
                      listener.url(), "--", "true", ":::", "1")
    assert nowhere.returncode == 2 and "webhook:" in nowhere.stderr, nowhere.stderr
    assert len(nowhere.stderr.strip().splitlines()) == 1, nowhere.stderr
    with pytest.raises(errors.NotFound):  # nothing half-created
        c.get_sweep("near")
    assert listener.paths == []


class HostsDaemon(testing.Daemon):
    """A daemon in a mount namespace of its own whose /etc/hosts is `hosts`: the test
    changes what a name resolves to while the daemon runs, touching no one else's."""

    def __init__(self, hosts: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hosts = hosts

    def command(self) -> list[str]:
        return ["unshare", "-m", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"',
                str(self.hosts), *super().command()]


def test_a_name_that_resolves_to_loopback_by_the_post_is_refused_there(
        listener: Listener, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    # A documentation address, never reached: the sweep's one cell waits on the gate
    # until the name has moved to the loopback.
    hosts.write_text("127.0.0.1 localhost\n198.51.100.7 hook.nodus.test\n")
    gate = tmp_path / "gate"
    d = HostsDaemon(hosts, cpus=2, memory="8GiB")
    try:
        d.start()
        c = d.client()
        c.create_sweep(one_cell("rebound", listener.url(host="hook.nodus.test"),
                                ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]))
        with hosts.open("w") as rewrite:  # in place: the bind mount keeps the inode
            rewrite.write("127.0.0.1 localhost\n127.0.0.1 hook.nodus.test\n")
        gate.touch()
        assert c.wait_sweep("rebound", timeout=60)["phase"] == "Succeeded"
        testing.wait_until(lambda: listener.paths or "refused" in d.log(),
                           "the webhook posted or refused")
        assert listener.paths == []
        assert "hook.nodus.test resolves to 127.0.0.1, a loopback address" in d.log(), \
            d.log()[-2000:]
    finally:
        d.close()


# --- image registries -----------------------------------------------------------------------


def test_allowing_webhooks_to_this_host_applies_on_a_reload(listener: Listener) -> None:
    with testing.daemon(cpus=2, memory="8GiB", config='kill_grace = "10s"\n') as d:
        c = d.client()
        with pytest.raises(errors.InvalidArgument, match="webhook_local_networks"):
            c.create_sweep(one_cell("later", listener.url()))
        assert d.config_path is not None
        d.config_path.write_text('kill_grace = "10s"\n' + ALLOW_LOOPBACK)
        testing.wait_until(lambda: "webhook_local_networks applied" in d.log(),
                           "the config reloaded")
        c.create_sweep(one_cell("later", listener.url()))
        assert c.wait_sweep("later", timeout=60)["phase"] == "Succeeded"
        testing.wait_until(lambda: listener.paths, "the webhook's post")
        assert listener.paths == ["/hook"]


def test_a_webhook_no_post_could_be_sent_to_is_a_400(daemon: testing.Daemon) -> None:
    c = daemon.client()
    # Each refused before any lookup leaves this host.
    for url in ("http://hook.example:99999/", "http://hook.example:x/", "http://a..b/"):
        with pytest.raises(errors.InvalidArgument) as caught:
            c.create_sweep(one_cell("odd", url))
        assert caught.value.field == "webhook", (url, caught.value)
