"""Issue 13, item 9: the references are the code's own. docs/cli.md and docs/sdk.md are what
their generators write from the commands and the SDK (so a command or a public name missing
from them fails here), and every `noduslocal ...` command the "coming from" pages and the
admin guide name is a command that exists."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest

import noduslocal

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def generator(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_the_commands() -> None:
    cli_reference = generator("cli_reference")
    text = (DOCS / "cli.md").read_text()
    for path, _ in cli_reference.commands():
        assert f"\n## `{' '.join(path)}`\n" in text, f"{' '.join(path)} is not in docs/cli.md"
    assert text == cli_reference.render(), \
        "docs/cli.md is not what the commands say: run python scripts/cli_reference.py"


def test_the_sdk_reference_is_the_sdk() -> None:
    sdk_reference = generator("sdk_reference")
    text = (DOCS / "sdk.md").read_text()
    for name in noduslocal.__all__:
        if name != "__version__":
            assert f"`nodus.{name}" in text, f"nodus.{name} is not in docs/sdk.md"
    for method in ("wait", "logs", "files", "outputs", "exec", "estimate", "suspend"):
        assert f"### `Job.{method}" in text, method
    assert text == sdk_reference.render(), \
        "docs/sdk.md is not what the SDK says: run python scripts/sdk_reference.py"


PAGES = [DOCS / "coming-from" / f"{peer}.md" for peer in
         ("slurm", "task-spooler", "pueue", "gflow")] + [DOCS / "admin.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_the_commands_a_page_names_exist(page: Path) -> None:
    found_commands = generator("cli_reference").commands()
    paths = {" ".join(path[1:]) for path, _ in found_commands}
    groups = {" ".join(path[1:]) for path, command in found_commands
              if isinstance(command, click.Group)}
    text = page.read_text()
    named = re.findall(r"`noduslocal ((?:[a-z][a-z-]* ?)+)", text)
    assert named, page
    for words in named:
        words = words.strip().split()
        # The longest run of words that is a command: `job run --gpus 2` names `job run`.
        found = next((" ".join(words[:n]) for n in range(len(words), 0, -1)
                      if " ".join(words[:n]) in paths), None)
        leftover = len(words) > len(found.split()) if found is not None else True
        assert found is not None and not (found in groups and leftover), \
            f"{page.name}: noduslocal {' '.join(words)} is no command"


@pytest.mark.parametrize("peer", ["slurm", "task-spooler", "pueue", "gflow"])
def test_each_coming_from_page_has_its_side_by_side_table(peer: str) -> None:
    text = (DOCS / "coming-from" / f"{peer}.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) >= 10, peer
