"""A sweep's cell parameters are its owner's: another user sees them masked wherever a
cell reaches them (the cells listing, the sweep's status, and the cell jobs' status and
listing, whose spec.command holds a map's values and whose env a grid's).

Two real Unix users (the `box` of tests/system/test_multiuser.py).
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from tests.system.test_multiuser import ALICE, BOB, SMALL, Box, box  # noqa: F401

MAP_SECRET = "s3cr3t-map-value"
GRID_SECRET = "s3cr3t-grid-value"


def views(box: Box, user: str, sweep: str, project: str) -> dict[str, Any]:  # noqa: F811
    """Every document of the sweep and its cells USER can read, by where it came from."""
    q = urllib.parse.urlencode({"project": project})
    found: dict[str, Any] = {}
    for path in (f"/v1/sweeps/{sweep}?{q}", f"/v1/sweeps/{sweep}/cells?{q}",
                 f"/v1/jobs/{sweep}-0?{q}", f"/v1/jobs?{q}&all=1", f"/v1/sweeps?{q}&all=1"):
        status, body = box.raw(user, "GET", path)
        assert status == 200, (path, body)
        found[path] = body
    for args in (("job", "status", f"{sweep}-0", "-p", project, "--json"),
                 ("job", "status", f"{sweep}-0", "-p", project)):
        result = box.cli(user, *args)
        assert result.returncode == 0, result.stderr
        found[" ".join(args)] = result.stdout
    return found


def test_a_map_sweeps_values_are_masked_in_its_cells_commands(box: Box) -> None:  # noqa: F811
    made = box.cli(ALICE, "map", "--name", "tok", "--no-code", "--no-canary", "--cpu", SMALL,
                   "--", "/bin/echo", "--token", "{}", ":::", MAP_SECRET)
    assert made.returncode == 0, made.stderr
    assert box.cli(ALICE, "job", "wait", "tok-0").returncode == 0
    owner = views(box, ALICE, "tok", ALICE)
    assert MAP_SECRET in json.dumps(owner[f"/v1/jobs/tok-0?project={ALICE}"]["spec"])
    for where, doc in views(box, BOB, "tok", ALICE).items():
        assert MAP_SECRET not in json.dumps(doc), where
    cell = box.raw(BOB, "GET", f"/v1/jobs/tok-0?project={ALICE}")[1]
    assert cell["spec"]["command"] == ["***"] * 3  # its shape, not its words


def test_a_grid_sweeps_values_are_masked_in_its_cells_env(box: Box) -> None:  # noqa: F811
    status, _ = box.raw(ALICE, "POST", "/v1/sweeps", {
        "name": "grd", "canary": "none", "grid": {"TOKEN": [GRID_SECRET]},
        "template": {"command": ["/bin/sh", "-c", "echo $TOKEN"], "cpu": SMALL}})
    assert status == 201
    assert box.cli(ALICE, "job", "wait", "grd-0").returncode == 0
    owner = views(box, ALICE, "grd", ALICE)
    assert GRID_SECRET in json.dumps(owner[f"/v1/jobs/grd-0?project={ALICE}"]["spec"])
    for where, doc in views(box, BOB, "grd", ALICE).items():
        assert GRID_SECRET not in json.dumps(doc), where


def test_a_plain_jobs_command_is_not_masked(box: Box) -> None:  # noqa: F811
    """Everyone may list jobs and see what they run (DESIGN §6); only cells are masked."""
    made = box.cli(ALICE, "job", "run", "--name", "plain", "--cpu", SMALL, "--",
                   "/bin/echo", "visible")
    assert made.returncode == 0, made.stderr
    status, doc = box.raw(BOB, "GET", f"/v1/jobs/plain?project={ALICE}")
    assert status == 200 and doc["spec"]["command"] == ["/bin/echo", "visible"]
