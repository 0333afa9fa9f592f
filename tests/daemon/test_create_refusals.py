"""What a create must refuse whole, over the real socket: bodies that are no JSON or that
no process could take, sizes too large for any number type, compressed bodies, names that
end in a newline, empty strings where a list or count belongs, a smoke command no process
could start, and image references docker's grammar does not take. Each is a 400 in the one
error shape naming the field, and nothing is made.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import importlib.util
import json
import socket
import urllib.parse
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from noduslocal import testing
from noduslocal.domain import errors
from tests.daemon.test_jobs_api import raw

CONFIG = 'image_pull = false\n'
DIGITS = "9" * 400


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(60)
        sock.connect(self._path)
        self.sock = sock


def send(d: testing.Daemon, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    conn = _Unix(str(d.socket))
    try:
        all_headers = {"Content-Type": "application/json", **(headers or {}),
                       "Content-Length": str(len(body or b""))}
        conn.putrequest(method, path, skip_accept_encoding=True)
        for key, value in all_headers.items():
            conn.putheader(key, value)
        # The daemon may answer a body it refuses (and close) before it has read it all.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()
        assert resp.getheader("Content-Type", "").startswith("application/json"), data
        return resp.status, json.loads(data) if data else None
    finally:
        conn.close()


def refused(d: testing.Daemon, method: str, path: str, doc: Any, field: str | None,
            headers: dict[str, str] | None = None, raw: bytes | None = None) -> str:
    """The request is a 400 in the one error shape naming FIELD; returns the message."""
    body = raw if raw is not None else json.dumps(doc).encode()
    status, answer = send(d, method, path, body, headers)
    assert status == 400, (status, answer)
    assert set(answer) == {"error"} and set(answer["error"]) == {"code", "message", "field"}
    assert answer["error"]["code"] == "InvalidArgument", answer
    if field is not None:
        assert answer["error"]["field"] == field, answer
    assert "\n" not in answer["error"]["message"], answer
    return str(answer["error"]["message"])


@pytest.fixture(scope="module")
def d() -> Iterator[testing.Daemon]:
    daemon = testing.Daemon(cpus=2, memory="8GiB", config=CONFIG)
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.close()


def made(d: testing.Daemon) -> tuple[list[str], ...]:
    """The names of everything the daemon holds."""
    client = d.client()
    return ([j["name"] for j in client.list_jobs(all=True)],
            [s["name"] for s in client.list_sweeps(all=True)],
            [v["name"] for v in client.list_volumes()],
            [s["name"] for s in client.list_secrets()])


@pytest.fixture
def nothing_made(d: testing.Daemon) -> Iterator[None]:
    """The test's requests leave the daemon holding what it held before."""
    before = made(d)
    yield
    assert made(d) == before


# --- sizes of 400 digits ----------------------------------------------------------------


@pytest.mark.usefixtures("nothing_made")
@pytest.mark.parametrize("field, value", [
    ("memory", int(DIGITS)), ("memory", DIGITS + "G"), ("memory", DIGITS + ".5MiB"),
    ("memory", 1e308), ("disk", int(DIGITS)), ("disk", DIGITS + "G"), ("disk", 2**63),
    ("cpu", int(DIGITS)), ("cpu", DIGITS), ("cpu", DIGITS + "m"),
])
def test_a_size_of_400_digits_is_a_400_naming_it(d: testing.Daemon, field: str,
                                                 value: Any) -> None:
    message = refused(d, "POST", "/v1/jobs", {"command": ["true"], field: value}, field)
    assert len(message) < 300, message  # names the limit, does not echo 400 digits
    refused(d, "POST", "/v1/sweeps", {"template": {"command": ["true"], field: value}},
            field)


@pytest.mark.usefixtures("nothing_made")
def test_a_gpu_memory_of_400_digits_is_a_400(d: testing.Daemon) -> None:
    refused(d, "POST", "/v1/jobs", {"command": ["true"], "gpu": {
        "count": 1, "min_memory": DIGITS + "GiB"}}, "gpu.min_memory")


# --- compressed bodies ----------------------------------------------------------------------

JOB = json.dumps({"name": "zipped", "command": ["true"]}).encode()


@pytest.mark.usefixtures("nothing_made")
@pytest.mark.parametrize("encoding, body", [
    ("gzip", gzip.compress(JOB, mtime=0)),
    ("gzip", b"not gzip at all"),
    ("deflate", zlib.compress(JOB)),
    ("deflate", b"\x00\x01garbage"),
    ("br", b"garbage"),
    ("x-unknown", JOB),
])
def test_a_compressed_body_is_a_400_naming_the_header(d: testing.Daemon, encoding: str,
                                                      body: bytes) -> None:
    # aiohttp's parser refuses brotli itself when the Brotli package is missing, before
    # any handler: in the one shape too, but without a field.
    brotli_missing = encoding == "br" and importlib.util.find_spec("brotli") is None
    message = refused(d, "POST", "/v1/jobs", None,
                      None if brotli_missing else "Content-Encoding",
                      {"Content-Encoding": encoding}, raw=body)
    assert ("brotli" if brotli_missing else "uncompressed") in message


def test_an_identity_encoding_is_taken(d: testing.Daemon) -> None:
    status, doc = send(d, "POST", "/v1/volumes", json.dumps({"name": "plain"}).encode(),
                       {"Content-Encoding": "identity"})
    assert status == 201, doc
    d.client().delete_volume("plain")


# --- names that end in a newline ------------------------------------------------------------


@pytest.mark.usefixtures("nothing_made")
@pytest.mark.parametrize("method, path, doc, field", [
    ("POST", "/v1/jobs", {"name": "nl\n", "command": ["true"]}, "name"),
    ("POST", "/v1/jobs", {"project": "nl\n", "command": ["true"]}, "project"),
    ("POST", "/v1/jobs", {"command": ["true"], "labels": {"key\n": "v"}}, "labels"),
    ("POST", "/v1/jobs", {"command": ["true"], "env": {"KEY\n": "v"}}, "env"),
    ("POST", "/v1/jobs", {"command": ["true"], "secrets": ["S\n"]}, "secrets"),
    ("POST", "/v1/jobs", {"command": ["true"], "volumes": {"/workspace/v": "vol\n"}},
     "volumes"),
    ("POST", "/v1/jobs", {"command": ["true"], "source": {"sha256": "a" * 64 + "\n"}},
     "source"),
    ("POST", "/v1/jobs", {"command": ["true"], "image": "busybox\n"}, "image"),
    ("POST", "/v1/jobs", {"command": ["true"], "outputs": {"out\n": "o.txt"}}, "outputs"),
    ("POST", "/v1/jobs", {"command": ["true"], "outputs": {"a/b\n": "o.txt"}}, "outputs"),
    ("POST", "/v1/sweeps", {"name": "nl\n", "template": {"command": ["true"]}}, "name"),
    ("POST", "/v1/sweeps", {"project": "nl\n", "template": {"command": ["true"]}},
     "project"),
    ("POST", "/v1/sweeps", {"template": {"command": ["true"]}, "grid": {"X\n": ["1"]}},
     "grid"),
    ("POST", "/v1/volumes", {"name": "vol\n"}, "name"),
    ("PUT", "/v1/secrets/" + urllib.parse.quote("S\n"), {"value": "v"}, None),
    ("GET", "/v1/jobs?project=" + urllib.parse.quote("nl\n"), None, "project"),
])
def test_a_name_ending_in_a_newline_is_refused(d: testing.Daemon, method: str, path: str,
                                               doc: Any, field: str | None) -> None:
    refused(d, method, path, doc, field, raw=None if doc is not None else b"")


@pytest.mark.usefixtures("nothing_made")
def test_a_source_digest_ending_in_a_newline_is_refused(d: testing.Daemon) -> None:
    refused(d, "GET", "/v1/sources/" + urllib.parse.quote("a" * 64 + "\n"), None, None,
            raw=b"")


# --- empty strings, smoke commands, images ---------------------------------------------------


@pytest.mark.usefixtures("nothing_made")
@pytest.mark.parametrize("field", ["retries", "args", "command", "env", "labels", "secrets",
                                   "outputs", "volumes"])
def test_an_empty_string_is_not_an_empty_list_or_zero(d: testing.Daemon, field: str) -> None:
    refused(d, "POST", "/v1/jobs", {"command": ["true"], field: ""}, field)


@pytest.mark.usefixtures("nothing_made")
@pytest.mark.parametrize("field, value", [("retries", False), ("retries", []),
                                          ("args", {}), ("env", []), ("outputs", [])])
def test_a_falsy_value_of_the_wrong_type_is_refused(d: testing.Daemon, field: str,
                                                    value: Any) -> None:
    refused(d, "POST", "/v1/jobs", {"command": ["true"], field: value}, field)


@pytest.mark.usefixtures("nothing_made")
def test_a_smoke_command_no_process_could_start_is_refused(d: testing.Daemon) -> None:
    smoke = "true # " + "x" * 200_000
    message = refused(d, "POST", "/v1/sweeps", {"template": {"command": ["true"]},
                                                "canary_smoke": smoke}, "canary_smoke")
    assert "bytes" in message


def test_a_smoke_command_that_fits_is_taken(d: testing.Daemon) -> None:
    body = {"name": "smoky", "template": {"command": ["true"]},
            "canary_smoke": "true # " + "x" * 4000}
    status, doc = send(d, "POST", "/v1/sweeps", json.dumps(body).encode())
    assert status == 201, doc
    assert d.client().wait_sweep("smoky", timeout=60)["phase"] == "Succeeded"
    d.client().gc_sweep("smoky")


BAD_IMAGES = ["NaN", "Python:3.11", "python:3.11\n", "a b", "busybox:", ":tag", "a//b",
              "-lead", "trail-", "a/B", "busybox@sha256:abc", "busybox:" + "t" * 129,
              "x" * 256, "ghcr.io/org/train:v2 ", "sha256:" + "é" * 3]


@pytest.mark.usefixtures("nothing_made")
@pytest.mark.parametrize("image", BAD_IMAGES)
def test_an_image_reference_outside_dockers_grammar_is_refused(d: testing.Daemon,
                                                               image: str) -> None:
    refused(d, "POST", "/v1/jobs", {"image": image}, "image")
    refused(d, "POST", "/v1/sweeps", {"template": {"image": image}}, "image")


def test_the_daemon_logged_no_failure_of_its_own(d: testing.Daemon) -> None:
    assert "unhandled error" not in d.log() and "Traceback" not in d.log()
    with pytest.raises(errors.NotFound):
        d.client().get_job("zipped")


BIG = "x" * 200_000  # one argument over the kernel's 128 KiB for a single string


@pytest.mark.parametrize(("method", "path", "body", "field"), [
    ("POST", "/v1/jobs", b'{"command": ["echo", "\xff\xfe"]}', "body"),
    ("POST", "/v1/volumes", b'{"name": "\xc3"}', "body"),
    ("PUT", "/v1/secrets/tok", b'{"value": "\xed\xa0\x80"}', "body"),
    ("POST", "/v1/jobs", b"[" * 5000 + b"]" * 5000, "body"),
    ("PUT", "/v1/secrets/tok", b'{"value": "\\ud800"}', "value"),
    ("POST", "/v1/jobs", b'{"command": ["echo", "\\udfff"]}', "command"),
    ("POST", "/v1/jobs", b'{"command": ["true"], "env": {"A": "\\ud800"}}', "env"),
    ("POST", "/v1/jobs", b'{"command": ["true"], "labels": {"a": "\\udfff"}}', "labels"),
    ("POST", "/v1/jobs", json.dumps({"command": ["echo", BIG]}).encode(), "command"),
    ("POST", "/v1/jobs", json.dumps({"command": ["true"], "env": {"A": BIG}}).encode(),
     "env"),
])
def test_bad_bodies_are_a_400_naming_the_field_and_create_nothing(
        d: testing.Daemon, method: str, path: str, body: bytes, field: str) -> None:
    before = made(d)
    status, reply = raw(d, method, path, body,
                        {"Content-Type": "application/json"})
    assert status == 400, reply
    assert reply["error"]["field"] == field, reply
    assert made(d) == before  # no job, no volume (nor sweep or secret)
    assert "Traceback" not in d.log()
