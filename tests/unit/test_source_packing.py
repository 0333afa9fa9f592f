"""A source packed by the client, without a daemon: a large one needs allow_large_source.
Sources through a real daemon are in tests/daemon/test_sources.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from noduslocal.domain import errors
from noduslocal.sdk.source import pack


def test_large_sources_need_allow_large(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import noduslocal.sdk.source as source

    monkeypatch.setattr(source, "LARGE_SOURCE", 10_000)
    (tmp_path / "big.bin").write_bytes(b"x" * 20_000)
    with pytest.raises(errors.InvalidArgument, match="allow_large_source=True"):
        pack([tmp_path], contents_of_single_dir=True)
    packed = pack([tmp_path], contents_of_single_dir=True, allow_large=True)
    assert packed.size > 20_000
    packed.path.unlink()
