"""Issue 10, item 4: outputs are copied sparse (a `truncate -s` file costs the store nothing
like its apparent size) and within a size cap per output and per job, and one left out says
why in the listing and on download. Real jobs, a real daemon and its blob store on disk.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

import pytest

from noduslocal import testing
from noduslocal.domain import errors

APPARENT = 200 * 2**20


def _blob(d: testing.Daemon, sha256: str) -> Path:
    return d.data_dir / "blobs" / sha256[:2] / sha256


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_a_sparse_output_stays_sparse_and_downloads_whole(daemon: testing.Daemon,
                                                          tmp_path: Path) -> None:
    """A 1.5 GB `truncate -s` output, no real space in the workspace, was written by root
    as a 1.5 GB blob (scaled down to 200 MiB here)."""
    client = daemon.client()
    make = (f"printf head > big && truncate -s {APPARENT} big && mkdir tree && "
            f"printf a > tree/a && truncate -s {APPARENT} tree/sparse && printf tail >> big")
    client.create_job({"name": "sparse", "command": ["sh", "-c", make], "cpu": "100m",
                       "outputs": {"big": "big", "tree": "tree"}})
    assert client.wait_job("sparse", timeout=60)["phase"] == "Succeeded"
    listed = {o["name"]: o for o in client.list_outputs("sparse", None)}
    content = b"head" + bytes(APPARENT - 4) + b"tail"
    big = listed["big"]
    assert big["collected"] and big["size"] == len(content)
    assert big["sha256"] == hashlib.sha256(content).hexdigest()
    assert _allocated(_blob(daemon, big["sha256"])) < 2**20
    tree = listed["tree"]
    assert tree["collected"] and tree["size"] > APPARENT
    assert _allocated(_blob(daemon, tree["sha256"])) < 2**20
    got = client.download_output("sparse", None, "big", tmp_path / "big")
    assert got.stat().st_size == len(content)
    with got.open("rb") as file:
        assert file.read(4) == b"head"
        file.seek(-4, os.SEEK_END)
        assert file.read() == b"tail"
    with tarfile.open(_blob(daemon, tree["sha256"])) as tar:
        assert tar.getmember("sparse").size == APPARENT


def test_outputs_over_their_caps_are_left_out_saying_why(tmp_path: Path) -> None:
    d = testing.Daemon(cpus=2, memory="4GiB",
                       config='max_output_size = "1MiB"\nmax_job_outputs = "1536KiB"\n')
    try:
        d.start()
        client = d.client()
        make = ("truncate -s 2M huge && head -c 900000 /dev/urandom > b && "
                "head -c 900000 /dev/urandom > c && mkdir dir && truncate -s 2M dir/x")
        client.create_job({"name": "capped", "command": ["sh", "-c", make], "cpu": "100m",
                           "outputs": {"huge": "huge", "b": "b", "c": "c", "dir": "dir"}})
        assert client.wait_job("capped", timeout=60)["phase"] == "Succeeded"
        listed = {o["name"]: o for o in client.list_outputs("capped", None)}
        assert listed["b"]["collected"] and listed["b"]["size"] == 900000
        assert not listed["huge"]["collected"]
        assert "max_output_size" in listed["huge"]["skipped"]
        assert listed["huge"]["size"] == 2 * 2**20
        assert not listed["c"]["collected"]
        assert "max_job_outputs" in listed["c"]["skipped"]
        assert not listed["dir"]["collected"] and "as a tar" in listed["dir"]["skipped"]
        with pytest.raises(errors.NotFound, match="max_output_size"):
            client.download_output("capped", None, "huge", tmp_path / "huge")
        assert not (tmp_path / "huge").exists()
        # Nothing of the refused ones stays in the store.
        blobs = [p for p in (d.data_dir / "blobs").rglob("*") if p.is_file()]
        assert len(blobs) == 1
    finally:
        d.close()
