"""One MCP server instance: connect, list tools, call them; restart with backoff when it dies.

A connection runs in its own task for its whole life: the SDK's client (anyio task groups)
must be entered and left in one task. Calls come from turn tasks and go through the
client's session, which multiplexes them (JSON-RPC ids), so calls of one step run
concurrently. The task notices a dead server when the transport's read stream ends
(stdio: the process exited; HTTP: the session was closed), or when a call saw the connection
fail, and then reconnects after a backoff delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import __version__
from ...secrets import Scrubber
from ..tools import ToolError
from .config import McpServerConfig

log = logging.getLogger("bub_bot.mcp")

CONNECT_TIMEOUT = 30.0
"""Seconds for the handshake and each tools/list page."""
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 60.0
STABLE_SECONDS = 60.0
"""A connection that stayed up this long starts the backoff from the beginning again."""
CLOSE_TIMEOUT = 10.0
"""Bound on closing one server (the SDK's stdio shutdown: stdin closed, 2 s, SIGTERM, 2 s,
SIGKILL)."""
MAX_EVENT_BYTES = 64 * 1024 * 1024
"""Largest Streamable HTTP event accepted (the SDK's default, 1 MB, is below what a tool
may return; big outputs are spilled on our side anyway)."""
MAX_TOOL_PAGES = 100
STDERR_LINES = 20
_REQUEST_TIMEOUT = -32001  # mcp_types.REQUEST_TIMEOUT (JSON-RPC), without importing the SDK


class McpUnavailable(ToolError):
    """The server is not connected; its tools cannot be called right now."""


@dataclass(frozen=True, slots=True)
class RemoteTool:
    """A tool as the server listed it (after the allow-list)."""

    name: str
    description: str
    input_schema: dict[str, Any]


class McpConnection:
    """One running instance of a configured server (stdio: in one working directory)."""

    def __init__(
        self, config: McpServerConfig, cwd: Path, on_change: Callable[[], None] = lambda: None
    ) -> None:
        self.config = config
        self.cwd = cwd
        self.state = "starting"
        """starting -> ready -> down (restart pending) -> ... -> stopped."""
        self.error: str | None = None
        self.tools: list[RemoteTool] = []
        """The last listed tools (kept while down, so a call can say why it fails)."""
        self.restarts = 0
        self.retry_at: float | None = None
        self.connected_at: float | None = None
        self._on_change = on_change
        self._scrubber = Scrubber(config.secrets)
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._first = asyncio.Event()
        self._stop = asyncio.Event()
        self._broken = asyncio.Event()
        self._relist = asyncio.Event()
        self._stderr: deque[str] = deque(maxlen=STDERR_LINES)
        self._was_ready = False

    @property
    def name(self) -> str:
        return self.config.name

    def scrub(self, text: str) -> str:
        """`text` without this server's secrets (env and header values)."""
        return self._scrubber.text(text)

    def scrub_value(self, value: Any) -> Any:
        """A result (text or structured) without this server's secrets."""
        return self._scrubber.value(value)

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Connect in the background (and keep reconnecting until `close`)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"mcp:{self.name}")

    async def wait_first(self, timeout: float) -> None:
        """Wait until the first connection attempt has ended (either way), at most `timeout`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first.wait(), timeout)

    async def close(self) -> None:
        """Disconnect: a stdio server gets its stdin closed, then SIGTERM, then SIGKILL."""
        self._stop.set()
        task = self._task
        if task is None or task.done():
            self.state = "stopped"
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), CLOSE_TIMEOUT)
        except TimeoutError:
            log.warning("mcp.close_timeout server=%s: cancelling", self.name)
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        except Exception:
            pass  # _run logs its own failures
        self.state = "stopped"

    async def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            started = time.monotonic()
            reason = ""
            self._was_ready = False
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                reason = self._describe(exc)
            if self._stop.is_set():
                break
            if not reason:
                reason = (
                    "the server process exited (or closed its stdout)"
                    if self.config.transport == "stdio"
                    else "the server closed the session"
                )
                tail = self._stderr_tail()
                if tail:
                    reason += f"; stderr: {tail}"
            if self._was_ready and time.monotonic() - started >= STABLE_SECONDS:
                attempt = 0
            delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2**attempt) * random.uniform(0.8, 1.2)
            attempt += 1
            self._set_down(reason, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            if not self._stop.is_set():
                self.restarts += 1
                self.state = "starting"
                self.retry_at = None
        self.state = "stopped"
        self._first.set()

    def _set_down(self, reason: str, delay: float) -> None:
        self.state, self.error = "down", reason
        self.retry_at = time.monotonic() + delay
        self._first.set()
        self._on_change()
        log.warning(
            "mcp.%s server=%s (%s): %s; retrying in %.1f s",
            "down" if self._was_ready else "start_failed",
            self.name,
            self.config.target,
            reason,
            delay,
        )

    async def _session(self) -> None:
        """One connection: handshake, list tools, serve calls until it ends or we stop."""
        await _load_sdk()
        from mcp import Client, Implementation

        closed = asyncio.Event()
        self._broken.clear()
        self._relist.clear()
        started = time.perf_counter()
        async with self._transport(closed) as transport:
            client = Client(
                transport,
                mode="legacy",  # the initialize handshake every server today speaks
                read_timeout_seconds=CONNECT_TIMEOUT,
                message_handler=self._on_message,
                client_info=Implementation(name="bub-bot", version=__version__),
                cache=None,
            )
            async with client:
                self.tools = await self._list_tools(client)
                self._client = client
                self.state, self.error, self.connected_at = "ready", None, time.monotonic()
                self._was_ready = True
                self._first.set()
                self._on_change()
                log.info(
                    "mcp.connected server=%s (%s) tools=%d elapsed_ms=%.0f",
                    self.name,
                    self.config.target,
                    len(self.tools),
                    (time.perf_counter() - started) * 1000,
                )
                try:
                    await self._serve(client, closed)
                finally:
                    self._client = None
                    if not self._stop.is_set():
                        self.state = "down"
                        self._on_change()

    async def _serve(self, client: Any, closed: asyncio.Event) -> None:
        """Wait for the end of the connection; re-list the tools when the server says so."""
        while True:
            waits = [
                asyncio.ensure_future(e.wait())
                for e in (self._stop, self._broken, closed, self._relist)
            ]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()
            if self._stop.is_set() or self._broken.is_set() or closed.is_set():
                return
            self._relist.clear()
            try:
                self.tools = await self._list_tools(client)
            except Exception as exc:
                log.warning("mcp.relist_failed server=%s: %s", self.name, self._describe(exc))
                return
            self._on_change()
            log.info("mcp.tools_changed server=%s tools=%d", self.name, len(self.tools))

    async def _on_message(self, message: Any) -> None:
        """Server notifications: a changed tool list is listed again by the connection task
        (a request from inside this handler would wait on the loop that delivers it)."""
        if isinstance(message, Exception):
            log.debug("mcp.transport_error server=%s: %s", self.name, self._describe(message))
            return
        method = getattr(message, "method", None)
        if method == "notifications/tools/list_changed":
            self._relist.set()

    async def _list_tools(self, client: Any) -> list[RemoteTool]:
        found: list[RemoteTool] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                if not self.config.allows(tool.name):
                    continue
                found.append(
                    RemoteTool(tool.name, (tool.description or "").strip(), tool.input_schema)
                )
            cursor = page.next_cursor
            if not cursor:
                break
        if self.config.tools is not None:
            missing = sorted(self.config.tools - {t.name for t in found})
            if missing:
                log.warning(
                    "mcp.allowlist server=%s: the server has no tool named %s",
                    self.name,
                    ", ".join(missing),
                )
        return found

    # -- transports ---------------------------------------------------------------------------
    @asynccontextmanager
    async def _transport(self, closed: asyncio.Event) -> AsyncIterator[Any]:
        """The SDK transport for this server, its read stream watched for its end."""
        if self.config.transport == "http":
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            timeout = httpx2.Timeout(CONNECT_TIMEOUT, read=max(300.0, self.config.timeout + 30))
            async with (
                httpx2.AsyncClient(headers=dict(self.config.headers), timeout=timeout) as http,
                streamable_http_client(
                    self.config.url, http_client=http, max_sse_event_size=MAX_EVENT_BYTES
                ) as (read, write),
            ):
                yield _watched(read, write, closed)
            return

        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(
            command=self.config.command,
            args=list(self.config.args),
            env=dict(self.config.env) or None,
            cwd=self.cwd,
        )
        errlog = self._stderr_pipe()
        try:
            async with stdio_client(params, errlog=errlog) as (read, write):
                errlog.close()  # the child holds its copy: EOF comes when it exits
                yield _watched(read, write, closed)
        finally:
            errlog.close()

    def _stderr_pipe(self) -> Any:
        """A pipe for the server's stderr: lines go to the debug log, the last few are kept
        for the message that says why a server failed."""
        read_fd, write_fd = os.pipe()
        self._stderr.clear()

        def pump() -> None:
            with open(read_fd, "rb") as pipe:
                for raw in pipe:
                    line = self.scrub(raw.decode("utf-8", "replace").rstrip())
                    if line:
                        self._stderr.append(line)
                        log.debug("mcp.stderr server=%s: %s", self.name, line)

        threading.Thread(target=pump, name=f"mcp-stderr:{self.name}", daemon=True).start()
        return open(write_fd, "w", encoding="utf-8")

    def _stderr_tail(self) -> str:
        lines = [line for line in self._stderr if line.strip()]
        return " | ".join(lines[-3:])[-500:]

    # -- calls --------------------------------------------------------------------------------
    def unavailable(self) -> str:
        """Why this server's tools cannot be called now."""
        if self.state == "stopped":
            return f"MCP server {self.name!r} is stopped"
        if self.state == "starting":
            return f"MCP server {self.name!r} is starting; try again in a moment"
        wait = ""
        if self.retry_at is not None:
            wait = f"; retrying in {max(0.0, self.retry_at - time.monotonic()):.0f} s"
        return f"MCP server {self.name!r} is not available ({self.error or 'down'}{wait})"

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """Call `tool`; returns the SDK's CallToolResult, raises ToolError on any failure."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        client = self._client
        if client is None:
            raise McpUnavailable(self.unavailable())
        timeout = self.config.timeout
        try:
            # The SDK's own per-request timeout (it tells the server to cancel); wait_for is a
            # backstop should the SDK not return.
            return await asyncio.wait_for(
                client.call_tool(tool, arguments, read_timeout_seconds=timeout), timeout + 5
            )
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise ToolError(
                    f"{tool} on MCP server {self.name!r} did not answer within {timeout:g} s"
                ) from None
            if exc.code == CONNECTION_CLOSED or "Session terminated" in str(exc):
                self._broken.set()
                raise ToolError(
                    f"MCP server {self.name!r} closed the connection during the call;"
                    " it is being restarted, try again in a moment"
                ) from None
            raise ToolError(
                f"MCP server {self.name!r} refused the call: {self.scrub(str(exc))}"
            ) from None
        except TimeoutError:
            raise ToolError(
                f"{tool} on MCP server {self.name!r} did not answer within {timeout:g} s"
            ) from None
        except (ToolError, asyncio.CancelledError):
            raise
        except Exception as exc:
            if self.config.transport == "http" and _is_transport_error(exc):
                self._broken.set()
            raise ToolError(
                f"MCP server {self.name!r} failed the call: {self._describe(exc)}"
            ) from None

    def _describe(self, exc: BaseException) -> str:
        """One line for an exception (groups unwrapped), secrets scrubbed."""
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if isinstance(exc, FileNotFoundError) and self.config.transport == "stdio":
            text = (
                f"command not found: {self.config.command!r}"
                if self.cwd.is_dir()
                else f"the working directory {self.cwd} does not exist"
            )
        elif isinstance(exc, TimeoutError) or getattr(exc, "code", None) == _REQUEST_TIMEOUT:
            text = f"no answer within {CONNECT_TIMEOUT:g} s"
        else:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        if self.config.transport == "stdio" and not isinstance(exc, FileNotFoundError):
            tail = self._stderr_tail()
            if tail:
                text += f"; stderr: {tail}"
        return self.scrub(text)


async def _load_sdk() -> None:
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


_sdk_loaded = False


def _is_transport_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("httpx2", "httpcore", "anyio") or isinstance(
        exc, OSError
    )


class _WatchedStream:
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

    def __aiter__(self) -> _WatchedStream:
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

    async def __aenter__(self) -> _WatchedStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        # e.g. `last_context` of the HTTP transport's stream
        return getattr(self._stream, name)


@asynccontextmanager
async def _watched_transport(read: Any, write: Any, closed: asyncio.Event) -> AsyncIterator[Any]:
    yield _WatchedStream(read, closed), write


def _watched(read: Any, write: Any, closed: asyncio.Event) -> Any:
    """A `Transport` (an async context manager of the two streams) for `mcp.Client`."""
    return _watched_transport(read, write, closed)
