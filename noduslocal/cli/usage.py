"""A refusal of the command line found after parsing (a bad KEY=VALUE, an unset --export
name), raised without click so the fast path can use it too; click's commands report it in
the CLI's one style through `as_click`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType


class Usage(Exception):
    """What is wrong with the command line; `flag` names the option when one is to blame."""

    def __init__(self, message: str, flag: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.flag = flag


class as_click:
    """Inside a click command: a `Usage` becomes click's own error, with the command's
    context, so it prints as every other refusal does. (A class, not contextlib's
    decorator: the fast path imports this module, and contextlib would cost it 1 ms.)"""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, Usage):
            import click

            if exc.flag is not None:
                raise click.BadParameter(exc.message, param_hint=exc.flag) from None
            raise click.UsageError(exc.message) from None
