"""How a connection reaches its server: the SDK's stdio and Streamable HTTP transports, with
the read stream watched for its end (the server died or closed the session) and a stdio
server's stderr captured; and the SDK imported off the event loop."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from ...mcp_config import McpServerConfig

log = logging.getLogger("bub_bot.mcp")

CONNECT_TIMEOUT = 30.0
"""Seconds for the handshake and each tools/list page (and an HTTP connection)."""
MAX_EVENT_BYTES = 64 * 1024 * 1024
"""Largest Streamable HTTP event accepted (the SDK's default, 1 MB, is below what a tool
may return; big outputs are spilled on our side anyway)."""
STDERR_LINES = 20

_sdk_loaded = False


async def load_sdk() -> None:
    """Import the SDK in a worker thread: it takes about half a second, which would otherwise
    stall every conversation (and /healthz) while the servers start."""
    global _sdk_loaded
    if not _sdk_loaded:
        await asyncio.to_thread(_import_sdk)
        _sdk_loaded = True


def _import_sdk() -> None:
    import httpx2  # noqa: F401
    import mcp
    import mcp.client.stdio
    import mcp.client.streamable_http  # noqa: F401


class Evidence:
    """What a server showed besides the protocol, for the message that says why it failed:
    a stdio server's stderr (each line also goes to the debug log; the last few are kept)
    and an HTTP server's last error status."""

    def __init__(self, server: str, scrub: Callable[[str], str]) -> None:
        self.server = server
        self.scrub = scrub
        self.lines: deque[str] = deque(maxlen=STDERR_LINES)
        self.http_error: str | None = None
        self._pump: threading.Thread | None = None

    def pipe(self) -> Any:
        """A new pipe for one process start; returns its write end (for the child)."""
        read_fd, write_fd = os.pipe()
        self.lines.clear()

        def pump() -> None:
            with open(read_fd, "rb") as pipe:
                for raw in pipe:
                    line = self.scrub(raw.decode("utf-8", "replace").rstrip())
                    if line:
                        self.lines.append(line)
                        log.debug("mcp.stderr server=%s: %s", self.server, line)

        self._pump = threading.Thread(target=pump, name=f"mcp-stderr:{self.server}", daemon=True)
        self._pump.start()
        return open(write_fd, "w", encoding="utf-8")

    async def settle(self, timeout: float = 0.5) -> None:
        """Let the stderr reader take in what an exited server wrote last (its stdout may
        close before its stderr is read); a grandchild holding the pipe only costs `timeout`."""
        pump = self._pump
        if pump is not None and pump.is_alive():
            await asyncio.to_thread(pump.join, timeout)

    def tail(self, stderr: bool = True) -> str:
        """The last HTTP error, or the last lines of stderr ("stderr: …"), on one line
        (`stderr=False`: the HTTP error only — stderr is for the log and `doctor`)."""
        if self.http_error:
            return self.http_error
        if not stderr:
            return ""
        last = " | ".join(line for line in list(self.lines)[-3:] if line.strip())[-500:]
        return f"stderr: {last}" if last else ""

    async def on_response(self, response: Any) -> None:
        """httpx2 response hook: remember an HTTP error (the SDK reports only "error")."""
        if response.status_code >= 400:
            self.http_error = f"HTTP {response.status_code} {response.reason_phrase}".strip()
            if response.status_code in (401, 403):
                self.http_error += " (check the headers)"


@asynccontextmanager
async def open_transport(
    config: McpServerConfig, cwd: Path, closed: asyncio.Event, evidence: Evidence
) -> AsyncIterator[Any]:
    """The SDK transport for `config` (a stdio child in `cwd`, or HTTP), ready for
    `mcp.Client`; `closed` is set when the server's side of it ends."""
    if config.transport == "http":
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        timeout = httpx2.Timeout(CONNECT_TIMEOUT, read=max(300.0, config.timeout + 30))
        evidence.http_error = None
        hooks = {"response": [evidence.on_response]}
        async with (
            httpx2.AsyncClient(
                headers=dict(config.headers), timeout=timeout, event_hooks=hooks
            ) as http,
            streamable_http_client(
                config.url, http_client=http, max_sse_event_size=MAX_EVENT_BYTES
            ) as (read, write),
        ):
            yield _watched(read, write, closed)
        return

    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=config.command, args=list(config.args), env=dict(config.env) or None, cwd=cwd
    )
    errlog = evidence.pipe()
    try:
        async with stdio_client(params, errlog=errlog) as (read, write):
            errlog.close()  # the child holds its copy: EOF comes when it exits
            yield _watched(read, write, closed)
    finally:
        errlog.close()


def is_transport_error(exc: BaseException) -> bool:
    """An HTTP/network failure (the connection is then rebuilt)."""
    return type(exc).__module__.split(".")[0] in ("httpx2", "httpcore", "anyio") or isinstance(
        exc, OSError
    )


class WatchedStream:
    """A read stream that sets `closed` when it ends, otherwise the SDK's stream as is."""

    def __init__(self, stream: Any, closed: asyncio.Event) -> None:
        self._stream = stream
        self._closed = closed

    async def receive(self) -> Any:
        import anyio

        try:
            return await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._closed.set()
            raise

    def __aiter__(self) -> WatchedStream:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._closed.set()
        await self._stream.aclose()

    async def __aenter__(self) -> WatchedStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        # e.g. `last_context` of the HTTP transport's stream
        return getattr(self._stream, name)


@asynccontextmanager
async def _watched_streams(read: Any, write: Any, closed: asyncio.Event) -> AsyncIterator[Any]:
    yield WatchedStream(read, closed), write


def _watched(read: Any, write: Any, closed: asyncio.Event) -> Any:
    """A `Transport` (an async context manager of the two streams) for `mcp.Client`."""
    return _watched_streams(read, write, closed)
