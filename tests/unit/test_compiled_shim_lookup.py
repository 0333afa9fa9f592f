"""Finding the compiled shim without a compiler: there is none, and nothing is built. Its
build with gcc and the daemon's choice of shim are in tests/system/test_compiled_shim.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from noduslocal.daemon.runtime import compiled_shim


def test_without_a_compiler_there_is_none(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled_shim.shutil, "which", lambda name: None)
    monkeypatch.setattr(compiled_shim, "PACKAGE_BIN", tmp_path / "nothing-here")
    assert compiled_shim.find(tmp_path / "data") is None
