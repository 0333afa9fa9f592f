"""The daemon's OpenAPI document, read without a daemon: every path parameter a route's
template names is declared (the fuzz in tests/daemon/test_api_fuzz.py fills a path from
them)."""

from __future__ import annotations

import re

from tests.daemon.test_api_fuzz import OPERATIONS


def test_every_path_parameter_of_the_document_is_declared() -> None:
    """The fuzz fills a path's {placeholders} from its declared parameters: one left
    undeclared would be sent as the literal text and never reach its handler."""
    assert len(OPERATIONS) >= 40  # the document still lists the routes
    for op in OPERATIONS:
        declared = {p["name"] for p in op.params if p["in"] == "path"}
        assert set(re.findall(r"{(\w+)}", op.template)) == declared, op.id
