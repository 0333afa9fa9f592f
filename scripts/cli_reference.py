"""Write docs/cli.md, the CLI reference, from click's own commands: each command's usage, its
help and its options. tests/unit/test_reference_docs.py fails when the file differs from what
this writes.

    python scripts/cli_reference.py          (rewrites docs/cli.md)
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "docs" / "cli.md"
HEAD = """# The `noduslocal` command

Every command, its usage, help and options, written by `python scripts/cli_reference.py`
from the commands themselves (a test fails when this file is not what it writes). `job
run`, `job list`, `map` and `sweep wait` are also parsed by a fast path without click
(docs/architecture.md), held to these same options by a test.
"""


def commands() -> list[tuple[list[str], click.Command]]:
    """Every command by its path, depth first, in the order `--help` lists them."""
    from noduslocal.cli.root import cli

    found: list[tuple[list[str], click.Command]] = []

    def walk(command: click.Command, path: list[str], parent: click.Context | None) -> None:
        ctx = click.Context(command, info_name=path[-1], parent=parent)
        found.append((path, command))
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name], ctx)

    walk(cli, ["noduslocal"], None)
    return found


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    out = [HEAD]
    for path, command in commands():
        ctx = click.Context(command, info_name=" ".join(path))
        out.append(f"\n## `{' '.join(path)}`\n\n")
        pieces = command.collect_usage_pieces(ctx)
        out.append(f"```\n{' '.join(path)} {' '.join(pieces)}\n```\n")
        if command.help:
            out.append("\n" + inspect.cleandoc(click.unstyle(command.help)) + "\n")
        rows = []
        help_option = command.get_help_option(ctx)
        for param in command.get_params(ctx):
            if not isinstance(param, click.Option) or param is help_option:
                continue  # arguments are in the usage line; --help is everywhere
            record = param.get_help_record(ctx)
            if record is None:
                continue
            flags, help_text = record
            rows.append(f"| `{_cell(flags)}` | {_cell(help_text)} |")
        if rows:
            out.append("\n| option | what |\n|---|---|\n" + "\n".join(rows) + "\n")
    return "".join(out)


def main() -> None:
    TARGET.write_text(render())
    print(f"wrote {TARGET.relative_to(REPO)} ({len(commands())} commands)", file=sys.stderr)


if __name__ == "__main__":
    main()
