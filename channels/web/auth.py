"""Access to the web chat and viewer: one token (Jupyter's rule), exchanged for a cookie.

- `?token=<token>` on a page, or the login form, sets an HttpOnly, SameSite=Strict cookie
  (its issue time and an HMAC of it keyed with the token, so the token itself never sits in
  the browser) and redirects to the same page without the token in its URL. The server
  refuses a cookie older than BUB_WEB_LOGIN_MAX_AGE_SECONDS (a leaked one expires), and
  marks it `Secure` when the browser uses https, also behind a trusted TLS-terminating
  proxy (`forwarded.py`).
- Scripts send `Authorization: Bearer <token>`.
- Everything else gets 401: a login form for pages, JSON for the API.
- State-changing requests must come from our own origin (Origin / Sec-Fetch-Site), on top
  of the SameSite cookie; tokens are compared in constant time and never logged.
- Guessing is slowed down (`attempts.py`): after 10 wrong tokens within a minute a client
  address (an IPv6 /64) gets 429 with Retry-After for every token it presents, right or
  wrong, until the oldest failure leaves the window. A valid cookie still works (it is an
  HMAC nobody guesses; a stale one after a restart is no attempt).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from aiohttp import web

from .attempts import FailedAttempts, client_key
from .forwarded import ForwardedProto
from .render import login_page

COOKIE = "bub_web"
COOKIE_MAX_AGE = 7 * 24 * 3600
"""The default of BUB_WEB_LOGIN_MAX_AGE_SECONDS."""
CLOCK_SKEW = 300
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    # No Referer leaves for other sites (the login link carries ?token=); not "no-referrer",
    # which makes browsers send `Origin: null` on our own POSTs.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def secure(response: web.StreamResponse, *, cache: str = "no-store") -> web.StreamResponse:
    """Add the security headers (call before a streamed response is prepared)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    response.headers.setdefault("Cache-Control", cache)
    return response


def same_origin(request: web.Request) -> bool:
    """Whether a state-changing request comes from one of our own pages.

    Browsers send `Origin` with every cross-origin POST (and `Sec-Fetch-Site`); a request
    with neither comes from a script, which has no cookie to abuse. Only the host part is
    compared: behind a TLS-terminating proxy the scheme we see is not the browser's.
    """
    origin = request.headers.get("Origin")
    if origin is not None:
        if origin == "null":
            return False
        try:
            netloc = urlsplit(origin).netloc
        except ValueError:
            return False
        return netloc.lower() == (request.host or "").lower()
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site in ("same-origin", "none")
    return True


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of presenting a token."""

    ok: bool
    wait: int = 0
    """Seconds the client must wait before presenting a token (too many wrong ones); the
    token was not compared."""


def _raw(value: str) -> bytes:
    """A header, cookie or form value as bytes to compare. aiohttp decodes bytes that are not
    UTF-8 to lone surrogates, which a plain `.encode()` refuses (a 500 before the check)."""
    return value.encode("utf-8", "surrogatepass")


def _safe_next(value: str | None) -> str:
    """A local path to go back to after logging in (never another site)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def _without_token(request: web.Request) -> str:
    query = [(k, v) for k, v in request.query.items() if k != "token"]
    return request.path + ("?" + urlencode(query) if query else "")


class Access:
    """Checks requests against the one token the chat and the viewer share."""

    def __init__(
        self,
        token: str,
        attempts: FailedAttempts | None = None,
        *,
        max_age: int = COOKIE_MAX_AGE,
        forwarded: ForwardedProto | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._token = token.encode()
        self.attempts = attempts or FailedAttempts()
        self.max_age = max_age
        self.forwarded = forwarded or ForwardedProto()
        self.clock = clock

    def _mac(self, issued: int) -> str:
        message = b"bub-bot web session:" + str(issued).encode()
        return hmac.new(self._token, message, hashlib.sha256).hexdigest()

    def cookie_value(self) -> str:
        """A new login cookie: `<issued unix time>.<HMAC of it keyed with the token>`."""
        issued = int(self.clock())
        return f"{issued}.{self._mac(issued)}"

    def cookie_ok(self, value: str) -> bool:
        """Whether `value` is a cookie we issued less than `max_age` seconds ago."""
        issued_text, _, mac = value.partition(".")
        if not issued_text.isascii() or not issued_text.isdigit() or len(issued_text) > 12:
            return False
        issued = int(issued_text)
        if not hmac.compare_digest(_raw(mac), self._mac(issued).encode()):
            return False
        age = self.clock() - issued
        return -CLOCK_SKEW <= age <= self.max_age

    def token_ok(self, given: str) -> bool:
        """Whether `given` is the token (constant time; any text, also undecodable bytes)."""
        return hmac.compare_digest(_raw(given), self._token)

    def check_token(self, request: web.Request, given: str) -> Verdict:
        """A token a client presented, counted against its address when wrong; not even
        compared while the address must wait."""
        key = client_key(request)
        wait = self.attempts.retry_after(key)
        if wait:
            return Verdict(False, wait)
        if self.token_ok(given):
            self.attempts.succeed(key)
            return Verdict(True)
        self.attempts.fail(key)
        return Verdict(False)

    def authenticated(self, request: web.Request) -> Verdict:
        """Whether the request carries our cookie or a valid bearer token."""
        cookie = request.cookies.get(COOKIE)
        if cookie and self.cookie_ok(cookie):
            return Verdict(True)
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            return Verdict(False)
        return self.check_token(request, auth[len("Bearer ") :])

    def _logged_in(self, request: web.Request, location: str) -> web.StreamResponse:
        response = web.Response(status=303, headers={"Location": location})
        response.set_cookie(
            COOKIE,
            self.cookie_value(),
            max_age=self.max_age,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=self.forwarded.https(request),
        )
        return secure(response)

    @staticmethod
    def unauthorized(
        request: web.Request, *, api: bool, message: str = "", next_path: str = ""
    ) -> web.Response:
        if api:
            response = web.json_response(
                {"error": "unauthorized", "hint": "send Authorization: Bearer <BUB_WEB_TOKEN>"},
                status=401,
            )
        else:
            text = message or "This page needs the access token."
            response = web.Response(
                text=login_page(text, next_path or _without_token(request)),
                status=401,
                content_type="text/html",
            )
        return secure(response)  # type: ignore[return-value]

    @staticmethod
    def too_many(
        request: web.Request, wait: int, *, api: bool, next_path: str = ""
    ) -> web.Response:
        """429 for a client that presented too many wrong tokens."""
        text = f"Too many wrong tokens from your address: try again in {wait} s."
        if api:
            response = web.json_response({"error": "too many failed attempts"}, status=429)
        else:
            response = web.Response(
                text=login_page(text, next_path or _without_token(request)),
                status=429,
                content_type="text/html",
            )
        response.headers["Retry-After"] = str(wait)
        return secure(response)  # type: ignore[return-value]

    def guard(self, handler: Handler, *, api: bool) -> Handler:
        """Wrap a route: token/cookie required, same origin for state changes, headers set."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            token = request.query.get("token")
            if token is not None and not api and request.method == "GET":
                verdict = self.check_token(request, token)
                if verdict.ok:
                    return self._logged_in(request, _without_token(request))
                if verdict.wait:
                    return self.too_many(request, verdict.wait, api=False)
                return self.unauthorized(request, api=False, message="That token is not valid.")
            verdict = self.authenticated(request)
            if not verdict.ok:
                if verdict.wait:
                    return self.too_many(request, verdict.wait, api=api)
                return self.unauthorized(request, api=api)
            if request.method not in ("GET", "HEAD") and not same_origin(request):
                return secure(web.json_response({"error": "cross-site request"}, status=403))
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                secure(exc)
                raise
            if not response.prepared:
                secure(response)
            return response

        return guarded

    async def login(self, request: web.Request) -> web.StreamResponse:
        """POST /login from the login form."""
        if not same_origin(request):
            return secure(web.json_response({"error": "cross-site request"}, status=403))
        try:
            form = await request.post()
        except (ValueError, LookupError):  # not text in its charset, or an unknown charset
            form = None
        # An unreadable form is a wrong token (counted like one), not a server error.
        token = form.get("token") if form is not None else ""
        next_path = _safe_next(str(form.get("next") or "/")) if form is not None else "/"
        verdict = self.check_token(request, token) if isinstance(token, str) else Verdict(False)
        if verdict.ok:
            return self._logged_in(request, next_path)
        if verdict.wait:
            return self.too_many(request, verdict.wait, api=False, next_path=next_path)
        return self.unauthorized(
            request, api=False, message="That token is not valid.", next_path=next_path
        )
