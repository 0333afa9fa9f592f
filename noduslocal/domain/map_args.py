"""`noduslocal map`'s arguments, GNU-parallel style: the command, then groups of values
each started by `:::` (space- or comma-separated, `name=v1,v2` names a group), or one
task per stdin line without `:::`; placeholders `{}` `{1}` `{name}` `{i}` `{n}`, and the
values appended when the command has none. Tasks are the cartesian product of the groups,
the last group varying fastest, computed by index so 10,000 tasks cost nothing up front.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from noduslocal.domain.errors import InvalidArgument

MARKER = ":::"
GROUP_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
# `{{` and `}}` are literal braces (as in Python's format strings), read before any
# placeholder: `python -c 'print(f"x{{n}}")'` keeps its f-string's {n}.
PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}\s]*)\}")
LITERAL = {"{{": "{", "}}": "}"}
RESERVED = frozenset({"i", "n"})  # {i} is the task's index, {n} the task count
MAX_TASKS = 1_000_000

GRAMMAR = """\
noduslocal map [OPTIONS] -- COMMAND ARGS... [::: VALUES...]...

Each ::: starts a group of values, separated by spaces or commas; `::: lr=1e-4,3e-4`
names the group lr. Every combination of one value per group is a task (the last group
varies fastest). Without :::, each line of standard input is one task's value.

Placeholders in COMMAND and ARGS:
  {}      the task's values (the single group's value); alone as an argument, one
          argument per value, else joined by spaces
  {1} {2} the value of group 1, 2, ... by position
  {lr}    the value of the group named lr
  {i}     the task's index, from 0          {n}  the number of tasks
A command without placeholders gets the task's values appended as arguments.
{{ and }} are literal braces (as in Python's format strings): python -c 'print(f"x{{n}}")'
runs print(f"x{n}"), while {n} alone would become the number of tasks.

Every task gets NODUS_TASK_ID, NODUS_WORLD_SIZE and NODUS_SWEEP in its environment, and
the same as SUPERCOMPUTER_TASK_ID, SUPERCOMPUTER_WORLD_SIZE and SUPERCOMPUTER_JOB.

Examples:
  noduslocal map -- python train.py --lr {lr} --bs {bs} ::: lr=1e-4,3e-4 ::: bs=32,64
  noduslocal map -- python gen.py --shard {} --of {n} ::: 0 1 2 3
  seq 0 99 | noduslocal map -- python proc.py {}
  noduslocal map --dry-run -- echo {1} {2} ::: a b ::: 1 2      # prints the commands
"""


@dataclass(frozen=True)
class Group:
    name: str | None
    values: tuple[str, ...]


@dataclass(frozen=True)
class Task:
    index: int
    argv: list[str]
    values: tuple[str, ...]  # one per group, in group order

    def named(self, groups: tuple[Group, ...]) -> dict[str, str]:
        """The task's values by group name (`1`, `2`, ... for unnamed groups)."""
        return {g.name or str(k + 1): v for k, (g, v) in enumerate(zip(groups, self.values,
                                                                          strict=True))}


@dataclass(frozen=True)
class Expansion:
    command: tuple[str, ...]
    groups: tuple[Group, ...]
    # One task per row (the SDK's list of mappings) instead of the groups' product; the
    # groups then only name the columns.
    rows: tuple[tuple[str, ...], ...] | None = None

    def __len__(self) -> int:
        if self.rows is not None:
            return len(self.rows)
        count = 1
        for group in self.groups:
            count *= len(group.values)
        return count

    @property
    def has_placeholder(self) -> bool:
        return any(_placeholders(token, self.groups) for token in self.command)

    def values(self, index: int) -> tuple[str, ...]:
        """Task `index`'s value of each group (mixed radix, last group fastest)."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        if self.rows is not None:
            return self.rows[index]
        picked: list[str] = []
        for group in reversed(self.groups):
            index, digit = divmod(index, len(group.values))
            picked.append(group.values[digit])
        return tuple(reversed(picked))

    def task(self, index: int) -> Task:
        values = self.values(index)
        total = len(self)
        if not self.has_placeholder:
            return Task(index, [*map(_literal, self.command), *values], values)
        argv: list[str] = []
        for token in self.command:
            if token == "{}":  # alone, each value is an argument of its own (as parallel)
                argv += values
            else:
                argv.append(_substitute(token, self.groups, values, index, total))
        return Task(index, argv, values)

    def tasks(self) -> Iterator[Task]:
        for index in range(len(self)):
            yield self.task(index)


def parse(args: list[str], stdin_lines: Iterable[str] | None = None) -> Expansion:
    """COMMAND ARGS... [::: VALUES...]...; without ::: the values are `stdin_lines`."""
    if MARKER in args:
        first = args.index(MARKER)
        command, rest = args[:first], args[first:]
        groups = _groups(rest)
    else:
        command = args
        if stdin_lines is None:
            raise InvalidArgument("args: no ::: groups and no standard input to read tasks "
                                  "from; see `noduslocal help map`", field="args")
        lines = tuple(line.rstrip("\n") for line in stdin_lines)
        if not lines:
            raise InvalidArgument("args: standard input had no lines, so there are no tasks",
                                  field="args")
        groups = (Group(None, lines),)
    if not command:
        raise InvalidArgument("command: nothing before the first :::", field="command")
    expansion = Expansion(tuple(command), groups)
    for token in command:
        for key in _placeholders(token, groups):
            if key.isdigit() and not 1 <= int(key) <= len(groups):
                raise InvalidArgument(f"command: {{{key}}} names group {key}, but there "
                                      f"{'is' if len(groups) == 1 else 'are'} {len(groups)}",
                                      field="command")
    if len(expansion) > MAX_TASKS:
        raise InvalidArgument(f"args: {len(expansion)} tasks; at most {MAX_TASKS} in one "
                              "sweep", field="args")
    return expansion


def structured(command: list[str], groups: list[tuple[str | None, list[str]]] | None = None,
               rows: tuple[list[str], list[list[str]]] | None = None) -> Expansion:
    """The SDK's forms, values taken as they are (no commas split): named groups whose
    product is the tasks, or column names with one row of values per task."""
    if not command or not command[0]:
        raise InvalidArgument("command: expected a non-empty command", field="command")
    if rows is not None:
        names, values = rows
        if not values or any(len(row) != len(names) for row in values):
            raise InvalidArgument("args: every task needs a value for each name",
                                  field="args")
        expansion = Expansion(tuple(command), tuple(Group(n, ()) for n in names),
                              tuple(tuple(row) for row in values))
    else:
        if not groups or any(not values for _, values in groups):
            raise InvalidArgument("args: every group needs values", field="args")
        expansion = Expansion(tuple(command), tuple(Group(n, tuple(v)) for n, v in groups))
    names = [g.name for g in expansion.groups if g.name]
    if len(set(names)) != len(names) or set(names) & RESERVED:
        raise InvalidArgument("args: names must differ, and may not be i or n",
                              field="args")
    if len(expansion) > MAX_TASKS:
        raise InvalidArgument(f"args: {len(expansion)} tasks; at most {MAX_TASKS} in one "
                              "sweep", field="args")
    return expansion


def _groups(rest: list[str]) -> tuple[Group, ...]:
    groups: list[Group] = []
    current: list[str] | None = None
    chunks: list[list[str]] = []
    for token in rest:
        if token == MARKER:
            current = []
            chunks.append(current)
        else:
            assert current is not None
            current.append(token)
    names: set[str] = set()
    for number, tokens in enumerate(chunks, 1):
        name = None
        if tokens and (named := GROUP_NAME.match(tokens[0])):
            name, first = named.group(1), named.group(2)
            tokens = [first, *tokens[1:]]
            if name in RESERVED:
                raise InvalidArgument(f"args: a group may not be named {name!r}: {{{name}}} "
                                      "is the task's " + ("index" if name == "i" else "count"),
                                      field="args")
            if name in names:
                raise InvalidArgument(f"args: two groups are named {name!r}", field="args")
            names.add(name)
        values = tuple(v for token in tokens for v in token.split(",") if v != "")
        if not values:
            raise InvalidArgument(f"args: group {number} after ::: has no values",
                                  field="args")
        groups.append(Group(name, values))
    return tuple(groups)


def _placeholders(token: str, groups: tuple[Group, ...]) -> list[str]:
    """The placeholders in `token` that mean something here; others stay as written."""
    names = {g.name for g in groups if g.name}
    return [match.group(1) for match in PLACEHOLDER.finditer(token)
            if match.group(0) not in LITERAL
            and (match.group(1) == "" or match.group(1).isdigit()
                 or match.group(1) in RESERVED or match.group(1) in names)]


def _literal(token: str) -> str:
    """TOKEN with its doubled braces made single (it has no placeholder)."""
    return PLACEHOLDER.sub(lambda m: LITERAL.get(m.group(0), m.group(0)), token)


def _substitute(token: str, groups: tuple[Group, ...], values: tuple[str, ...], index: int,
                total: int) -> str:
    by_name = {g.name: v for g, v in zip(groups, values, strict=True) if g.name}

    def value(match: re.Match[str]) -> str:
        if match.group(0) in LITERAL:
            return LITERAL[match.group(0)]
        key = match.group(1)
        if key == "":
            return " ".join(values)
        if key.isdigit():
            return values[int(key) - 1]
        if key == "i":
            return str(index)
        if key == "n":
            return str(total)
        return by_name.get(key, match.group(0))

    return PLACEHOLDER.sub(value, token)
