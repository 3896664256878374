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
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import __version__
from ...mcp_config import McpServerConfig
from ...secrets import Scrubber
from ..tools import ToolError
from .transport import CONNECT_TIMEOUT, Evidence, is_transport_error, load_sdk, open_transport

log = logging.getLogger("bub_bot.mcp")

BACKOFF_FIRST = 0.5
BACKOFF_MAX = 60.0
STABLE_SECONDS = 60.0
"""A connection that stayed up this long starts the backoff from the beginning again."""
CLOSE_TIMEOUT = 10.0
SHORT_REASON = 200
"""Characters of the short reason /tools shows."""
"""Bound on closing one server (the SDK's stdio shutdown: stdin closed, 2 s, SIGTERM, 2 s,
SIGKILL)."""
MAX_TOOL_PAGES = 100
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
        self,
        config: McpServerConfig,
        cwd: Path,
        on_change: Callable[[], None] = lambda: None,
        scrubber: Scrubber | None = None,
    ) -> None:
        self.config = config
        self.cwd = cwd
        self.state = "starting"
        """starting -> ready -> down (restart pending) -> ... -> stopped."""
        self.error: str | None = None
        """Why it is down, short and scrubbed, without the server's stderr (/tools)."""
        self.error_detail: str | None = None
        """The same with the stderr tail (scrubbed): for the log and `bub-bot doctor`."""
        self.tools: list[RemoteTool] = []
        """The last listed tools (kept while down, so a call can say why it fails)."""
        self.restarts = 0
        self.retry_at: float | None = None
        self.connected_at: float | None = None
        self._on_change = on_change
        # The union of every server's secrets (and the bot's), when the manager gives it:
        # server A's token coming out of server B is redacted too.
        self._scrubber = scrubber if scrubber is not None else Scrubber(config.secrets)
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._first = asyncio.Event()
        self._stop = asyncio.Event()
        self._broken = asyncio.Event()
        self._relist = asyncio.Event()
        self._evidence = Evidence(config.name, self.scrub)
        self._was_ready = False

    @property
    def name(self) -> str:
        return self.config.name

    def scrub(self, text: str) -> str:
        """`text` without the known secrets (every server's env and header values)."""
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
            failure: Exception | None = None
            self._was_ready = False
            try:
                await self._session()
            except Exception as exc:
                failure = exc
            if self._stop.is_set():
                break
            await self._evidence.settle()  # a dying server's last stderr lines
            if failure is not None:
                short, reason = self._describe(failure, stderr=False), self._describe(failure)
            else:
                short = reason = (
                    "the server process exited (or closed its stdout)"
                    if self.config.transport == "stdio"
                    else "the server closed the session"
                )
                tail = self._evidence.tail()
                if tail:
                    reason += f"; {self.scrub(tail)}"
                http = self._evidence.tail(stderr=False)  # an HTTP status, never stderr
                if http:
                    short += f"; {self.scrub(http)}"
            if self._was_ready and time.monotonic() - started >= STABLE_SECONDS:
                attempt = 0
            delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2**attempt) * random.uniform(0.8, 1.2)
            attempt += 1
            self._set_down(short, reason, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            if not self._stop.is_set():
                self.restarts += 1
                self.state = "starting"
                self.retry_at = None
        self.state = "stopped"
        self._first.set()

    def _set_down(self, short: str, reason: str, delay: float) -> None:
        """Down: `short` (no stderr) is what chat members may see in /tools; `reason`
        (with the stderr tail, scrubbed) goes to the log and to `doctor`."""
        self.state, self.error, self.error_detail = "down", short[:SHORT_REASON], reason
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
        await load_sdk()
        from mcp import Client, Implementation

        closed = asyncio.Event()
        self._broken.clear()
        self._relist.clear()
        started = time.perf_counter()
        async with open_transport(self.config, self.cwd, closed, self._evidence) as transport:
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
                self.error_detail = None
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
                    f"MCP server {self.name!r} closed the connection; it is being"
                    " restarted, try again in a moment"
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
            if self.config.transport == "http" and is_transport_error(exc):
                self._broken.set()
            # The result goes to the model and the tape: no stderr tail (the log has it).
            log.warning(
                "mcp.call_failed server=%s tool=%s: %s", self.name, tool, self._describe(exc)
            )
            raise ToolError(
                f"MCP server {self.name!r} failed the call: {self._describe(exc, stderr=False)}"
            ) from None

    def _describe(self, exc: BaseException, *, stderr: bool = True) -> str:
        """One line for an exception (groups unwrapped), secrets scrubbed; with the last
        HTTP error, or the last stderr lines unless `stderr` is False (what chat members,
        the model and the tape see: stderr may carry anything)."""
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
        if not isinstance(exc, FileNotFoundError):
            evidence = self._evidence.tail(stderr=stderr)
            if evidence:
                text += f"; {evidence}"
        return self.scrub(text)
