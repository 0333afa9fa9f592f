"""Request bodies: JSON that is valid UTF-8, nested at most MAX_DEPTH deep and holding no
lone surrogate anywhere (text that could be neither stored nor given to a process), or a
400 naming the field before any handler sees it.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from noduslocal.domain import errors

MAX_DEPTH = 32  # levels of nesting; no body of ours needs more than four


def _bad_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check(value: Any) -> None:
    """Refuse what JSON allows but nothing downstream can hold: deep nesting, and lone
    surrogates (`"\\ud800"`) in keys or strings."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise errors.InvalidArgument(f"body: nested more than {MAX_DEPTH} levels deep",
                                         field="body")
        if isinstance(item, str):
            if _bad_text(item):
                field = path.split(".")[0].split("[")[0] or "body"
                raise errors.InvalidArgument(
                    f"{path or 'body'}: not valid Unicode (a lone surrogate); send UTF-8 "
                    "text", field=field)
        elif isinstance(item, dict):
            for key, sub in item.items():
                where = f"{path}.{key}" if path else str(key)
                stack.append((key, where, depth + 1))
                stack.append((sub, where, depth + 1))
        elif isinstance(item, list):
            stack.extend((sub, f"{path}[{i}]", depth + 1) for i, sub in enumerate(item))


def parse(raw: bytes) -> Any:
    """The body's JSON value (None for an empty body)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.InvalidArgument(f"body: not valid UTF-8 (byte {exc.start})",
                                     field="body") from None
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except RecursionError:
        raise errors.InvalidArgument(f"body: nested more than {MAX_DEPTH} levels deep",
                                     field="body") from None
    except json.JSONDecodeError as exc:
        raise errors.InvalidArgument(f"body: not valid JSON ({exc.msg} at character "
                                     f"{exc.pos})", field="body") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4,300)
        raise errors.InvalidArgument(f"body: {exc}", field="body") from None
    check(value)
    return value


async def read(request: web.Request) -> Any:
    return parse(await request.read())
