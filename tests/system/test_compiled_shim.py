"""Finding and building the compiled shim, and the daemon's choice of shim; the shim's own
behaviour is tested against both shims in test_shim.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from noduslocal import testing
from noduslocal.daemon.runtime import compiled_shim


def test_built_once_named_by_its_source_and_trusted_only_if_safe(tmp_path: Path) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        if os.environ.get("CI"):
            pytest.fail("no C compiler: scripts/test.sh installs gcc")
        pytest.skip("no C compiler")
    built = compiled_shim.build(tmp_path / "bin")
    assert built is not None and built.name == compiled_shim.binary_name()
    assert compiled_shim._trusted(built)
    os.chmod(built, 0o777)  # anyone could swap it for their own program: never run it
    assert not compiled_shim._trusted(built)
    os.chmod(built, 0o755)
    os.chmod(built.parent, 0o777)
    assert not compiled_shim._trusted(built)


def test_the_daemon_starts_the_compiled_shim_unless_told_not_to(tmp_path: Path) -> None:
    if compiled_shim.find(tmp_path / "probe") is None:
        if os.environ.get("CI"):
            pytest.fail("no compiled shim: scripts/test.sh builds it")
        pytest.skip("no compiled shim here")
    for config, compiled in (("", True), ('host_shim = "python"\n', False)):
        d = testing.Daemon(config=config)
        try:
            d.start()
            # The job's parent is its shim.
            job = d.client().create_job({"command": ["sh", "-c", "readlink /proc/$PPID/exe"]})
            done = d.client().wait_job(job["name"], timeout=30)
            assert done["phase"] == "Succeeded"
            parent = b"".join(d.client().logs(job["name"])).decode().strip()
            assert (compiled_shim.binary_name() in parent) == compiled, parent
        finally:
            d.close()
    bad = testing.Daemon(config='host_shim = "fast"\n')
    with pytest.raises(RuntimeError, match="host_shim: expected one of auto, python"):
        bad.start()
    bad.close()
