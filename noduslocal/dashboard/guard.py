"""Who may talk to the dashboard: a one-time token printed to its user's terminal, traded
for an HttpOnly SameSite=Strict session cookie; a Host header that names this server (DNS
rebinding); a CSRF token on every POST; and the headers every answer carries (a strict
Content-Security-Policy, nosniff, no framing, no caching, no referrer).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

TOKEN_PARAM = "token"
CSRF_HEADER = "X-CSRF-Token"
MAX_SESSIONS = 16  # browsers holding a session at once (the oldest is dropped)

# Scripts and styles from this server only (no inline code, no eval); uPlot draws on a
# canvas and sets element styles from script, which CSP allows. Data comes from here only.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Session:
    id: str
    csrf: str


class Guard:
    def __init__(self) -> None:
        self.port = 0  # known once the server listens
        self._token: str | None = secrets.token_urlsafe(32)
        self._sessions: dict[str, Session] = {}

    @property
    def cookie(self) -> str:
        # Cookies are not told apart by port: each dashboard on this host has its own name.
        return f"noduslocal_dashboard_{self.port}"

    def login_url(self) -> str:
        assert self._token is not None, "the one-time token was used"
        return f"http://127.0.0.1:{self.port}/?{TOKEN_PARAM}={self._token}"

    def hosts(self) -> set[str]:
        return {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}

    def session(self, request: web.Request) -> Session | None:
        value = request.cookies.get(self.cookie, "")
        found = self._sessions.get(value)
        if found is None or not hmac.compare_digest(found.id, value):
            return None
        return found

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await self._checked(request, handler)
        except web.HTTPException as exc:
            response = web.Response(status=exc.status, text=exc.text,
                                    headers={k: v for k, v in exc.headers.items()
                                             if k.lower() in ("allow", "location")})
        return response

    @staticmethod
    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        """Every answer's headers, a stream's too (sent before its body)."""
        del request
        response.headers.update(HEADERS)

    async def _checked(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.host not in self.hosts():
            # A page of another site that resolves its name to 127.0.0.1 (DNS rebinding)
            # sends its own name: never served, whatever cookie it may carry.
            raise web.HTTPForbidden(text=f"noduslocal dashboard: Host {request.host!r} is "
                                         f"not this server; use {self.login_host()}\n")
        if TOKEN_PARAM in request.query:
            return self._login(request)
        session = self.session(request)
        if session is None:
            raise web.HTTPForbidden(
                text="noduslocal dashboard: not signed in; open the link that "
                     "`noduslocal dashboard` printed (it works once), or start it again\n")
        if request.method not in ("GET", "HEAD"):
            self._check_post(request, session)
        request["session"] = session
        return await handler(request)

    def login_host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _login(self, request: web.Request) -> web.StreamResponse:
        given = request.query.get(TOKEN_PARAM, "")
        if self._token is None or not hmac.compare_digest(given.encode(),
                                                          self._token.encode()):
            raise web.HTTPForbidden(text="noduslocal dashboard: that link was used already or "
                                         "is wrong; start `noduslocal dashboard` again\n")
        self._token = None  # one time: a link that leaked from the terminal is worth nothing
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32))
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions)))
        self._sessions[session.id] = session
        query = {k: v for k, v in request.query.items() if k != TOKEN_PARAM}
        target = request.rel_url.with_query(query)
        response = web.Response(status=303, headers={"Location": str(target)})
        response.set_cookie(self.cookie, session.id, httponly=True, samesite="Strict",
                            path="/")
        return response

    def _check_post(self, request: web.Request, session: Session) -> None:
        if request.method != "POST":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD", "POST"])
        origin = request.headers.get("Origin")
        if origin is not None and origin not in {f"http://{h}" for h in self.hosts()}:
            raise web.HTTPForbidden(text=f"noduslocal dashboard: a POST from {origin!r} is "
                                         f"refused\n")
        given = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(given.encode(), session.csrf.encode()):
            raise web.HTTPForbidden(text="noduslocal dashboard: the request lacks this "
                                         "page's CSRF token; reload the page\n")
