"""`noduslocal map`'s argument grammar: our own forms (named groups, commas, {i}, {n}) and
the refusals. The forms GNU parallel also accepts are checked against Debian's `parallel
--dry-run` in tests/system/test_map_arguments_vs_parallel.py."""

from __future__ import annotations

import shlex

import pytest

from noduslocal.domain.errors import InvalidArgument
from noduslocal.domain.map_args import GRAMMAR, parse


def test_named_groups_and_commas() -> None:
    expansion = parse(["python", "train.py", "--lr", "{lr}", "--bs", "{bs}",
                       ":::", "lr=1e-4,3e-4", ":::", "bs=32", "64"])
    assert [shlex.join(t.argv) for t in expansion.tasks()] == [
        "python train.py --lr 1e-4 --bs 32", "python train.py --lr 1e-4 --bs 64",
        "python train.py --lr 3e-4 --bs 32", "python train.py --lr 3e-4 --bs 64"]
    assert expansion.task(3).named(expansion.groups) == {"lr": "3e-4", "bs": "64"}
    assert parse(["echo", ":::", "1,2", "3"]).task(2).argv == ["echo", "3"]


def test_index_and_count() -> None:
    expansion = parse(["gen", "--shard", "{i}", "--of", "{n}", "--x={}"], ["a\n", "b\n"])
    assert [t.argv for t in expansion.tasks()] == [
        ["gen", "--shard", "0", "--of", "2", "--x=a"],
        ["gen", "--shard", "1", "--of", "2", "--x=b"]]


def test_braces_that_are_no_placeholder_stay() -> None:
    task = parse(["awk", "{print $1}", "{foo}", "{}", ":::", "f"]).task(0)
    assert task.argv == ["awk", "{print $1}", "{foo}", "f"]


def test_ten_thousand_tasks_are_computed_by_index() -> None:
    expansion = parse(["run", "{1}", "{2}", ":::", *map(str, range(100)),
                       ":::", *map(str, range(100))])
    assert len(expansion) == 10_000
    assert expansion.task(9_999).argv == ["run", "99", "99"]
    assert expansion.task(101).argv == ["run", "1", "1"]


@pytest.mark.parametrize(("args", "stdin", "message"), [
    ([":::", "a"], None, "command: nothing before the first :::"),
    (["echo", ":::"], None, "group 1 after ::: has no values"),
    (["echo", ":::", "x=", ","], None, "group 1 after ::: has no values"),
    (["echo", "{3}", ":::", "a", ":::", "b"], None, "{3} names group 3, but there are 2"),
    (["echo", ":::", "i=1,2"], None, "may not be named 'i'"),
    (["echo", ":::", "a=1", ":::", "a=2"], None, "two groups are named 'a'"),
    (["echo", "{}"], None, "no ::: groups and no standard input"),
    (["echo", "{}"], "", "standard input had no lines"),
])
def test_refusals_name_what_is_wrong(args: list[str], stdin: str | None,
                                     message: str) -> None:
    lines = stdin.splitlines(keepends=True) if stdin is not None else None
    with pytest.raises(InvalidArgument, match=message.replace("{", r"\{").replace(
            "}", r"\}")):
        parse(args, lines)


def test_the_grammar_names_every_placeholder() -> None:
    for placeholder in ("{}", "{1}", "{lr}", "{i}", "{n}", ":::", "SUPERCOMPUTER_TASK_ID",
                        "NODUS_TASK_ID"):
        assert placeholder in GRAMMAR


def test_doubled_braces_are_literal_braces_as_in_python_format() -> None:
    """Issue 28: `{n}` inside a task's inline code was silently replaced; `{{n}}` keeps it."""
    expansion = parse(["python", "-c", 'print(f"x{{n}}", {n}, "{{}}")', "{}",
                       ":::", "a", "b"])
    assert [t.argv for t in expansion.tasks()] == [
        ["python", "-c", 'print(f"x{n}", 2, "{}")', "a"],
        ["python", "-c", 'print(f"x{n}", 2, "{}")', "b"]]
    # Without any placeholder the values are appended, and the braces still made single.
    assert parse(["echo", "{{i}}", ":::", "v"]).task(0).argv == ["echo", "{i}", "v"]
    assert "{{ and }} are literal braces" in GRAMMAR


def test_help_map_keeps_the_grammar_s_lines() -> None:
    """Issue 28: `noduslocal help map` printed the grammar as one run-on paragraph."""
    from click.testing import CliRunner

    from noduslocal.cli.root import cli

    shown = CliRunner().invoke(cli, ["help", "map"], terminal_width=100).output
    lines = [line.strip() for line in shown.splitlines()]
    assert "{lr}    the value of the group named lr" in lines, shown
    assert "seq 0 99 | noduslocal map -- python proc.py {}" in lines, shown
