"""A fake web site for web.fetch tests: real HTTP (or HTTPS) on a loopback address.

Usage::

    async with FakeSite("127.0.0.2") as site:
        site.route("/", lambda request: web.Response(text="<h1>hi</h1>", content_type="text/html"))
        ... fetch site.url("/") ...
        assert site.paths() == ["/"]

Every request is recorded (path, headers) before its handler runs, also for paths without
a route (they answer 404), so a test can assert that a site saw no request at all.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse] | web.StreamResponse]


@dataclass
class Seen:
    """One request as the site saw it."""

    method: str
    path: str
    headers: dict[str, str]


class FakeSite:
    """An aiohttp server on `host` (a loopback address) with routes set by the test."""

    def __init__(self, host: str = "127.0.0.1", ssl_context: ssl.SSLContext | None = None):
        self.host = host
        self.ssl_context = ssl_context
        self.routes: dict[str, Handler] = {}
        self.requests: list[Seen] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    def route(self, path: str, handler: Handler) -> None:
        self.routes[path] = handler

    def page(self, path: str, body: str | bytes, content_type: str = "text/html") -> None:
        """`path` answers `body` with this Content-Type header (as given)."""
        data = body.encode() if isinstance(body, str) else body
        self.route(path, lambda _r: web.Response(body=data, headers={"Content-Type": content_type}))

    def redirect(self, path: str, location: str, status: int = 302) -> None:
        self.route(path, lambda _r: web.Response(status=status, headers={"Location": location}))

    def url(self, path: str = "/", host: str | None = None) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://{host or self.host}:{self.port}{path}"

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    async def _any(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(Seen(request.method, request.path, dict(request.headers)))
        handler = self.routes.get(request.path)
        if handler is None:
            return web.Response(status=404, text="not found")
        answer: Any = handler(request)
        if not isinstance(answer, web.StreamResponse):
            answer = await answer
        return answer

    async def __aenter__(self) -> FakeSite:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._any)
        self._runner = web.AppRunner(
            app, handle_signals=False, handler_cancellation=True, shutdown_timeout=0.1
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0, ssl_context=self.ssl_context)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
