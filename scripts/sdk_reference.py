"""Write docs/sdk.md, the SDK reference: every public name of `import noduslocal as nodus`
(its `__all__`), each class's public methods and properties with their signatures and
docstrings, and the exceptions of `nodus.errors`. tests/unit/test_reference_docs.py fails
when the file differs from what this writes.

    python scripts/sdk_reference.py          (rewrites docs/sdk.md)
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "docs" / "sdk.md"
HEAD = """# The SDK: `import noduslocal as nodus`

Every public name, written by `python scripts/sdk_reference.py` from the code itself (a test
fails when this file is not what it writes). The semantics are the Nodus SDK's
(`Job`, `Sweep`); where this host differs, docs/decisions.md says how.
"""


def _doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__) if obj.__doc__ else ""


def _signature(obj: Any) -> str:
    """OBJ's parameters as a caller writes them: no `self` or `cls`."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    params = [p for p in signature.parameters.values() if p.name not in ("self", "cls")]
    return str(signature.replace(parameters=params)).replace("'", "")


def members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties defined by CLS or a base of ours, in source order."""
    found: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        if not base.__module__.startswith("noduslocal"):
            continue
        for name, value in vars(base).items():
            if not name.startswith("_"):
                found[name] = value
    return list(found.items())


def _member(cls_name: str, name: str, value: Any) -> str:
    if isinstance(value, property):
        head = f"### `{cls_name}.{name}` (property)"
        doc = _doc(value.fget)
    elif isinstance(value, classmethod | staticmethod):
        head = f"### `{cls_name}.{name}{_signature(value.__func__)}`"
        doc = _doc(value.__func__)
    elif callable(value):
        head = f"### `{cls_name}.{name}{_signature(value)}`"
        doc = _doc(value)
    else:
        head = f"### `{cls_name}.{name}`"
        doc = ""
    return f"\n{head}\n\n{doc}\n" if doc else f"\n{head}\n"


def render() -> str:
    import noduslocal
    from noduslocal.domain import errors

    out = [HEAD]
    for name in sorted(noduslocal.__all__):
        if name in ("errors", "__version__"):
            continue
        obj = getattr(noduslocal, name)
        if inspect.isclass(obj):
            out.append(f"\n## `nodus.{name}`\n\n{_doc(obj)}\n")
            for member, value in members(obj):
                out.append(_member(name, member, value))
        else:
            out.append(f"\n## `nodus.{name}{_signature(obj)}`\n\n{_doc(obj)}\n")
    out.append("\n## `nodus.errors`\n\n" + _doc(errors) + "\n\n| exception | code | HTTP | "
               "CLI exit | what |\n|---|---|---|---|---|\n")
    for cls in sorted((c for c in vars(errors).values() if inspect.isclass(c)
                       and issubclass(c, errors.NodusError)), key=lambda c: c.__name__):
        summary = " ".join(_doc(cls).split("\n\n")[0].split())
        out.append(f"| `{cls.__name__}` | {getattr(cls, 'code', '')} | "
                   f"{getattr(cls, 'http_status', '')} | {getattr(cls, 'cli_exit', '')} | "
                   f"{summary} |\n")
    out.append(f"\n`nodus.__version__` is `{noduslocal.__version__}`.\n")
    return "".join(out)


def main() -> None:
    TARGET.write_text(render())
    print(f"wrote {TARGET.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
