"""Bounds on HTTP connections, so slow or idle clients cannot take the server down.

aiohttp has no limit on how long a client may take to send a request's headers or body,
nor on how many connections are open: 300 connections sending headers a byte at a time
exhausted the file descriptors. `ConnectionGuard` wraps aiohttp's protocol per connection
and watches each one's phase:

- `headers`: from the connection (or the first byte after an idle keep-alive) until the
  blank line ending the headers: at most BUB_HTTP_HEADER_TIMEOUT_SECONDS (10 s);
- `body`: a Content-Length or chunked body until its last byte: at most
  BUB_HTTP_BODY_TIMEOUT_SECONDS (30 s) from the first byte of the request;
- `handling`: a handler runs (also a long SSE stream): no limit from here;
- `idle`: a finished request on a kept-alive connection: at most
  BUB_HTTP_IDLE_TIMEOUT_SECONDS (75 s).

At most BUB_HTTP_MAX_CONNECTIONS connections (default 1000, lowered to what the file
descriptor limit leaves); when full, the oldest connection in a slow phase (headers, body,
idle) is closed to make room, else the new one is. Health checks thus keep answering under
a slowloris attack. One sweep a second checks the deadlines (cheap for a thousand).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

FD_RESERVE = 128
"""Descriptors kept for the database, MCP servers, platform connections and logs."""
HEADER_LIMIT = 64 * 1024


def connection_cap(wanted: int) -> int:
    """`wanted` connections, lowered to what RLIMIT_NOFILE leaves (the soft limit is raised
    to the hard one first, as servers do)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        elif hard == resource.RLIM_INFINITY and soft != hard:
            soft = max(soft, 65536)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    except (OSError, ValueError):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(8, min(wanted, soft - FD_RESERVE))


class _Conn:
    """One connection's phase and deadline."""

    __slots__ = ("deadline", "handlers", "opened", "phase", "proto", "seen", "transport", "want")

    def __init__(self, proto: _Guarded, now: float, header_timeout: float) -> None:
        self.proto = proto
        self.transport: asyncio.Transport | None = None
        self.opened = now
        self.phase = "headers"
        self.deadline: float | None = now + header_timeout
        self.seen = b""
        """The request's header bytes so far (until the blank line)."""
        self.want: int | None = None
        """Body bytes still expected (None: chunked, watched for its last chunk)."""
        self.handlers = 0


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard watching what comes in."""

    def __init__(self, guard: ConnectionGuard, inner: Any) -> None:
        self.guard = guard
        self.inner = inner
        self.conn = _Conn(self, guard.clock(), guard.header_timeout)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn.transport = transport  # type: ignore[assignment]
        self.guard._opened(self.conn)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.guard._data(self.conn, data)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard._closed(self.conn)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class ConnectionGuard:
    """Connection limits and phase deadlines for one aiohttp server (see the module doc)."""

    def __init__(
        self,
        *,
        max_connections: int = 1000,
        header_timeout: float = 10.0,
        body_timeout: float = 30.0,
        idle_timeout: float = 75.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_connections = connection_cap(max_connections)
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.idle_timeout = idle_timeout
        self.clock = clock
        self.conns: dict[asyncio.BaseTransport, _Conn] = {}
        self.closed_slow = 0
        """Connections closed for a missed deadline or to make room (for logs and tests)."""
        self._sweeper: asyncio.Task[None] | None = None

    # -- wiring --------------------------------------------------------------------------------
    def factory(self, inner: Callable[[], Any]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for `loop.create_server` around aiohttp's one."""
        return lambda: _Guarded(self, inner())

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Marks a connection busy while its handler runs (no deadline then), idle after."""
        conn = self.conns.get(request.transport) if request.transport else None
        if conn is None:
            return await handler(request)
        conn.handlers += 1
        if conn.phase != "body":
            conn.phase, conn.deadline = "handling", None
        try:
            return await handler(request)
        finally:
            conn.handlers -= 1
            if conn.handlers == 0 and conn.phase == "handling":
                conn.phase, conn.deadline = "idle", self.clock() + self.idle_timeout

    def start(self) -> None:
        """Start the once-a-second deadline sweep."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
            self._sweeper = None

    # -- events --------------------------------------------------------------------------------
    def _opened(self, conn: _Conn) -> None:
        if len(self.conns) >= self.max_connections:
            victim = self._oldest_slow()
            if victim is None:
                log.warning("http.refused connections=%d (all busy)", len(self.conns))
                self._close(conn, "refused")
                return
            self._close(victim, "evicted")
        assert conn.transport is not None
        self.conns[conn.transport] = conn

    def _closed(self, conn: _Conn) -> None:
        if conn.transport is not None:
            self.conns.pop(conn.transport, None)

    def _data(self, conn: _Conn, data: bytes) -> None:
        now = self.clock()
        if conn.phase in ("idle", "handling") and conn.handlers == 0:
            conn.phase, conn.seen, conn.deadline = "headers", b"", now + self.header_timeout
        if conn.phase == "headers":
            conn.seen += data
            end = conn.seen.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.seen) > HEADER_LIMIT:
                    conn.seen = conn.seen[-4:]  # aiohttp refuses oversized headers itself
                return
            head, rest = conn.seen[:end].lower(), conn.seen[end + 4 :]
            conn.seen = b""
            conn.want = _body_length(head)
            if conn.want == 0:
                conn.phase, conn.deadline = "handling", None
                return
            conn.phase = "body"
            conn.deadline = (conn.deadline or now) - self.header_timeout + self.body_timeout
            data = rest
        if conn.phase == "body":
            if conn.want is None:  # chunked: ends with the zero-length chunk
                conn.seen = (conn.seen + data)[-7:]
                done = conn.seen.endswith(b"0\r\n\r\n")
            else:
                conn.want -= len(data)
                done = conn.want <= 0
            if done:
                conn.seen = b""
                conn.phase, conn.deadline = "handling", None

    # -- limits --------------------------------------------------------------------------------
    def _oldest_slow(self) -> _Conn | None:
        slow = [c for c in self.conns.values() if c.phase != "handling" and c.handlers == 0]
        return min(slow, key=lambda c: c.opened) if slow else None

    def _close(self, conn: _Conn, why: str) -> None:
        self.closed_slow += 1
        self._closed(conn)
        if conn.transport is not None:
            log.debug("http.%s phase=%s", why, conn.phase)
            conn.transport.abort()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.header_timeout / 4))
            now = self.clock()
            late = [c for c in self.conns.values() if c.deadline is not None and c.deadline <= now]
            for conn in late:
                if conn.handlers and conn.phase == "idle":
                    continue
                self._close(conn, f"{conn.phase}_timeout")
            if late:
                log.info("http.timeouts closed=%d open=%d", len(late), len(self.conns))


def _body_length(head: bytes) -> int | None:
    """Body bytes a request announces: Content-Length, None for chunked, else 0."""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip()
        if name == b"transfer-encoding" and b"chunked" in value:
            return None
        if name == b"content-length":
            try:
                length = max(0, int(value.strip()))
            except ValueError:
                return 0  # aiohttp answers 400 itself
    return length


class GuardedSite(web.TCPSite):
    """aiohttp's TCP site with every connection under a `ConnectionGuard`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard):
        super().__init__(runner, host, port)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.guard.factory(server),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self.guard.start()

    async def stop(self) -> None:
        await self.guard.stop()
        await super().stop()


__all__ = ["ConnectionGuard", "GuardedSite", "connection_cap"]
