"""The exception tree and its stable error codes, shared by the daemon, the SDK and the CLI.

The API sends `{"error": {"code", "message", "field"}}`; `from_wire` turns that back into the
same class on the client. Each class says its HTTP status and the CLI's exit code once, here.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: `typing` costs every CLI call its import
    from typing import Any, ClassVar


class NodusError(Exception):
    code: ClassVar[str] = "Internal"
    http_status: ClassVar[int] = 500
    cli_exit: ClassVar[int] = 1  # the CLI's exit status for this error

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def to_wire(self) -> dict[str, Any]:
        # `field` always: null when the error is about no field of the request.
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}


class InvalidArgument(NodusError):
    code = "InvalidArgument"
    http_status = 400
    cli_exit = 2


class Unsupported(InvalidArgument):
    """A parameter of the reference API that this version does not implement yet."""

    code = "Unsupported"

    def __init__(self, field: str, detail: str = "", *, message: str | None = None) -> None:
        extra = f": {detail}" if detail else ""
        text = message or f"{field} is not supported by noduslocal yet{extra}"
        super().__init__(text, field=field)


class PayloadTooLarge(InvalidArgument):
    code = "PayloadTooLarge"
    http_status = 413


class AlreadyExists(NodusError):
    code = "AlreadyExists"
    http_status = 409
    cli_exit = 2


class Conflict(NodusError):
    """The request is valid but the object's state does not allow it now."""

    code = "Conflict"
    http_status = 409


class ResourceExhausted(NodusError):
    """A cap was reached (a user's share of a pool, the disk's reserve): try again later,
    or ask an admin to raise it."""

    code = "ResourceExhausted"
    http_status = 429


class NotFound(NodusError):
    code = "NotFound"
    http_status = 404


class PermissionDenied(NodusError):
    code = "PermissionDenied"
    http_status = 403


class DaemonUnavailable(NodusError):
    """Raised by the client when nothing answers on the socket."""

    code = "DaemonUnavailable"
    http_status = 503


class WaitTimeout(NodusError, TimeoutError):
    code = "WaitTimeout"
    http_status = 408


class JobFailed(NodusError):
    """`Job.wait()` on a job that ended without succeeding."""

    code = "JobFailed"

    def __init__(
        self,
        message: str,
        *,
        name: str = "",
        phase: str = "",
        reason: str | None = None,
        exit_code: int | None = None,
        log_tail: str = "",
    ) -> None:
        super().__init__(message)
        self.name = name
        self.phase = phase
        self.reason = reason
        self.exit_code = exit_code
        self.log_tail = log_tail

    def __str__(self) -> str:
        if not self.log_tail:
            return self.message
        return f"{self.message}\n--- last lines of the log ---\n{self.log_tail.rstrip()}"


class JobCancelled(JobFailed):
    code = "JobCancelled"


class ChecksumMismatch(NodusError):
    """A download whose bytes do not hash to the X-Nodus-SHA256 the daemon sent."""

    code = "ChecksumMismatch"
    http_status = 502


class Internal(NodusError):
    code = "Internal"


_BY_CODE: dict[str, type[NodusError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        PayloadTooLarge,
        AlreadyExists,
        Conflict,
        ResourceExhausted,
        NotFound,
        PermissionDenied,
        DaemonUnavailable,
        WaitTimeout,
        ChecksumMismatch,
        Internal,
    )
}


# An error answered to a WebSocket handshake (`job exec -it`): clients read the body of a
# refused upgrade from this header, as its JSON.
ERROR_HEADER = "X-Nodus-Error"


def from_wire(status: int, body: Any) -> NodusError:
    """The exception a client raises for an error response."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return Internal(f"daemon answered HTTP {status} without an error body")
    code = str(err.get("code", "Internal"))
    message = str(err.get("message", ""))
    field = err.get("field")
    if code == Unsupported.code:
        return Unsupported(str(field or ""), message=message)
    return _BY_CODE.get(code, Internal)(message, field=field)
