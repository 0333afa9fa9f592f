"""JSON for the client's requests and answers on CPython's C codec (`_json`) directly: the
json package imports `re` for its pure-Python fallback, and `re` with `enum` costs a CLI call
a quarter of its time. `dumps` and `loads` give what json's do with their defaults; json's
own are used where `_json` is missing.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

try:
    from _json import encode_basestring_ascii, make_encoder, make_scanner
except ImportError:  # not CPython: the json package, with its price
    from json import dumps, loads
else:
    _WHITESPACE = " \t\n\r"

    class _Parsing:
        """What the C scanner reads off its context: json.loads' defaults."""

        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = {"NaN": float("nan"), "Infinity": float("inf"),
                          "-Infinity": float("-inf")}.__getitem__
        memo: dict[str, str] = {}

    _scan = make_scanner(_Parsing())

    def _not_serializable(value: object) -> object:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    def loads(text: str | bytes) -> Any:
        if isinstance(text, bytes | bytearray):
            text = text.decode()
        start = len(text) - len(text.lstrip(_WHITESPACE))
        try:
            value, end = _scan(text, start)
        except StopIteration as exc:
            raise ValueError(f"not JSON: expecting a value at character {exc.value}") \
                from None
        finally:
            _Parsing.memo.clear()
        if text[end:].strip(_WHITESPACE):
            raise ValueError(f"not JSON: extra data at character {end}")
        return value

    def dumps(value: Any) -> str:
        encode = make_encoder({}, _not_serializable, encode_basestring_ascii, None, ": ",
                              ", ", False, False, True)
        return "".join(encode(value, 0))
