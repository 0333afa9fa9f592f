"""Dependencies across users, on a box with real Unix users: another user's job can be
waited for when named with its project (every job's state is readable by every user),
never found by its bare name, which means one's own project."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.system.lab import Box, open_box

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def box() -> Iterator[Box]:
    with open_box() as b:
        yield b


def test_another_users_job_is_named_with_its_project(box: Box) -> None:
    alice, bob = box.alice.name, box.bob.name
    made = box.cli(alice, "job", "run", "-d", "--name", "dep-a", "--", "true")
    assert made.returncode == 0, made.stderr
    bare = box.cli(bob, "job", "run", "-d", "--after", "dep-a", "--", "true")
    assert bare.returncode == 2 and "after: there is no job 'dep-a'" in bare.stderr, \
        bare.stderr
    named = box.cli(bob, "job", "run", "-d", "--name", "dep-b", "--after", f"{alice}/dep-a",
                    "--", "true")
    assert named.returncode == 0, named.stderr
    done = box.cli_json(bob, "job", "wait", "dep-b", "--json")
    assert done["phase"] == "Succeeded"
    assert done["spec"]["after"][0]["project"] == alice
