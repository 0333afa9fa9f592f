"""The `after` grammar (domain/dependencies.py) without a daemon: what is taken, what is
refused with one line naming the field, and what each condition makes of an end."""

from __future__ import annotations

import pytest

from noduslocal.domain.dependencies import Dependency, parse_after, verdict
from noduslocal.domain.errors import InvalidArgument
from noduslocal.domain.validation import parse_create


def test_the_grammar() -> None:
    assert parse_after(["pre", "afterany:team/prep", "afternotok:sweep:lr",
                        {"sweep": "team/grid", "condition": "afterany"}]) == [
        Dependency("pre"), Dependency("prep", "team", "afterany"),
        Dependency("lr", None, "afternotok", sweep=True),
        Dependency("grid", "team", "afterany", sweep=True)]
    assert parse_after("a,afterany:b") == [Dependency("a"), Dependency("b", None, "afterany")]
    assert parse_after(None) == []


@pytest.mark.parametrize("value", [
    ["afterwards:pre"], ["Pre"], ["pre:"], [""], ["a/b/c"], ["sweep:"], [3], "",
    [{"job": "pre", "condition": "afterbad"}], [{"job": "a", "sweep": "b"}],
    ["pre", "afterany:pre"], {"job": "pre"}, ["afterok:afterany:pre"],
])
def test_refusals_name_the_field(value: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_after(value)
    assert info.value.field == "after" and info.value.message.startswith("after: ")


def test_create_takes_after_into_the_spec() -> None:
    req = parse_create({"command": ["true"], "after": ["afterany:pre"]}, regions=("local",))
    assert req.spec.after == [Dependency("pre", None, "afterany")]
    wire = req.spec.to_wire()["after"]
    assert wire == [{"kind": "job", "name": "pre", "project": None, "condition": "afterany",
                     "id": None}]


@pytest.mark.parametrize(("condition", "phase", "met"), [
    ("afterok", "Succeeded", True), ("afterok", "Failed", False),
    ("afterok", "Cancelled", False), ("afterok", "Running", None),
    ("afterany", "Failed", True), ("afterany", "Succeeded", True),
    ("afterany", "Pending", None), ("afternotok", "Failed", True),
    ("afternotok", "Cancelled", True), ("afternotok", "Succeeded", False),
    ("afternotok", "Suspended", None),
])
def test_each_condition_judges_an_end(condition: str, phase: str, met: bool | None) -> None:
    assert verdict(Dependency("x", condition=condition), phase) is met
    assert verdict(Dependency("x", condition=condition, sweep=True), phase) is met
