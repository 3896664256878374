"""The configured MCP servers as a source of tools for the registry.

Instances by workspace: a stdio server is a process with a working directory, so it runs
once per workspace that uses it (keyed by (server, workspace)); a Streamable HTTP server does
not depend on a directory, so one connection serves every workspace. Instances for the
default workspace (`BUB_WORKSPACE`) start with the bot; an instance for another workspace
starts the first time a session there needs tools (`prepare`). Today every session uses
`BUB_WORKSPACE`, so each server runs once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from ...mcp_config import McpServerConfig
from ...secrets import Scrubber
from ..tools import Tool, ToolContext, ToolError
from .connection import McpConnection, RemoteTool
from .results import error_text, result_value

log = logging.getLogger("bub_bot.mcp")

FIRST_CONNECT_WAIT = 10.0
"""How long a turn waits for servers still on their first connection attempt (a server
started with `npx -y` may be downloading). Later restarts never hold a turn up."""
MAX_NAME = 64  # OpenAI function names: ^[a-zA-Z0-9_-]{1,64}$
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class _NoParams(pydantic.BaseModel):
    """Placeholder: an MCP tool's arguments are checked by its server against its schema."""


def exposed_name(server: str, tool: str) -> str:
    """`mcp.<server>.<tool>` as the model sees it: dots (and anything else a function name
    cannot hold) become `_`, like the built-in tools; a name past 64 characters is cut and
    gets a short hash so it stays unique."""
    name = _UNSAFE.sub("_", f"mcp_{server}_{tool}")
    if len(name) > MAX_NAME:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[: MAX_NAME - 9]}_{digest}"
    return name


def _parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """The server's input schema as OpenAI `parameters` (an object schema)."""
    params = {k: v for k, v in (schema or {}).items() if k != "$schema"}
    params["type"] = "object"
    params.setdefault("properties", {})
    return params


@dataclass(eq=False)
class McpTool(Tool):
    """A tool of an MCP server; arguments go to the server as the model wrote them."""

    server: str = ""
    remote: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)
    exposed: str = ""

    @property
    def exposed_name(self) -> str:
        return self.exposed

    def arguments(self, raw: dict[str, Any]) -> dict[str, Any]:
        return {"arguments": raw}

    def _build_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.exposed,
                "description": self.description,
                "parameters": _parameters(self.input_schema),
            },
        }


def _make_tool(connection: McpConnection, remote: RemoteTool) -> McpTool:
    async def handler(ctx: ToolContext, /, arguments: dict[str, Any]) -> Any:
        started = time.perf_counter()
        try:
            result = await connection.call(remote.name, arguments)
        except ToolError as exc:
            log.warning(
                "mcp.call_failed session=%s server=%s tool=%s: %s",
                ctx.tape.session_id,
                connection.name,
                remote.name,
                exc,
            )
            raise
        elapsed = (time.perf_counter() - started) * 1000
        if result.is_error:
            log.info(
                "mcp.call session=%s server=%s tool=%s error=true elapsed_ms=%.0f",
                ctx.tape.session_id,
                connection.name,
                remote.name,
                elapsed,
            )
            raise ToolError(connection.scrub(error_text(result)))
        log.debug(
            "mcp.call session=%s server=%s tool=%s elapsed_ms=%.0f",
            ctx.tape.session_id,
            connection.name,
            remote.name,
            elapsed,
        )
        return connection.scrub_value(result_value(result))

    server = connection.name
    description = remote.description or f"{remote.name} (from the MCP server {server})"
    return McpTool(
        name=f"mcp.{server}.{remote.name}",
        description=description,
        params=_NoParams,
        handler=handler,
        server=server,
        remote=remote.name,
        input_schema=remote.input_schema,
        exposed=exposed_name(server, remote.name),
    )


@dataclass(frozen=True, slots=True)
class ServerOverview:
    """A server as `/tools` and `/readyz` show it."""

    name: str
    transport: str
    target: str
    state: str
    """ready | starting | down | stopped | disabled"""
    detail: str
    tools: list[Tool]
    restarts: int = 0


class McpManager:
    """Every configured server's instances; offers the tools of the connected ones."""

    def __init__(
        self, servers: list[McpServerConfig], workspace: Path, scrubber: Scrubber | None = None
    ) -> None:
        self.servers = servers
        self.scrubber = scrubber or Scrubber(s for c in servers for s in c.secrets)
        """One scrubber for every connection: the union of all servers' secrets."""
        self.workspace = workspace.resolve()
        self._connections: dict[tuple[str, Path | None], McpConnection] = {}
        self._tools: dict[tuple[str, Path | None], list[McpTool]] = {}
        self._offered: dict[tuple[Path, frozenset[str]], list[Tool]] = {}
        self._resolved: dict[Path, Path] = {}
        self._closed = False

    # -- instances ----------------------------------------------------------------------------
    def _workspace(self, workspace: Path | None) -> Path:
        if workspace is None:
            return self.workspace
        found = self._resolved.get(workspace)
        if found is None:  # resolve() costs syscalls; it is asked on every step and call
            found = self._resolved[workspace] = workspace.resolve()
        return found

    def _key(self, config: McpServerConfig, workspace: Path) -> tuple[str, Path | None]:
        return (config.name, workspace if config.transport == "stdio" else None)

    def connections(self, workspace: Path | None = None) -> list[McpConnection]:
        """The instances serving `workspace` (started on first use)."""
        where = self._workspace(workspace)
        found = []
        for config in self.servers:
            if not config.enabled:
                continue
            key = self._key(config, where)
            connection = self._connections.get(key)
            if connection is None and not self._closed:
                connection = McpConnection(config, where, self._changed, self.scrubber)
                self._connections[key] = connection
                connection.start()
            if connection is not None:
                found.append(connection)
        return found

    def start(self) -> None:
        """Connect every enabled server for the default workspace, in the background."""
        self.connections(self.workspace)

    async def prepare(self, workspace: Path | None = None) -> None:
        """Before a turn: wait (bounded) for servers still on their first attempt."""
        pending = [c for c in self.connections(workspace) if c.state == "starting"]
        pending = [c for c in pending if c.restarts == 0]
        if pending:
            await asyncio.gather(*(c.wait_first(FIRST_CONNECT_WAIT) for c in pending))

    async def wait_started(self, timeout: float = FIRST_CONNECT_WAIT) -> None:
        """Wait until every default-workspace server has connected or failed once."""
        await asyncio.gather(*(c.wait_first(timeout) for c in self.connections()))

    async def close(self) -> None:
        """Disconnect every instance (stdio children are terminated and reaped)."""
        self._closed = True
        await asyncio.gather(*(c.close() for c in self._connections.values()))
        self._offered.clear()

    def _changed(self) -> None:
        self._offered.clear()
        self._tools.clear()

    # -- the registry's view ------------------------------------------------------------------
    def _connection_tools(self, connection: McpConnection) -> list[McpTool]:
        key = self._key(connection.config, connection.cwd)
        built = self._tools.get(key)
        if built is None or [t.remote for t in built] != [r.name for r in connection.tools]:
            built = [_make_tool(connection, remote) for remote in connection.tools]
            self._tools[key] = built
        return built

    def tools(self, workspace: Path | None = None, reserved: set[str] | None = None) -> list[Tool]:
        """The tools offered to the model now: those of connected servers, allow-listed,
        without names that collide with `reserved` (built-in) or an earlier server's."""
        where = self._workspace(workspace)
        key = (where, frozenset(reserved or ()))
        offered = self._offered.get(key)
        if offered is not None:
            return offered
        taken = set(key[1])
        offered = []
        for connection in self.connections(where):
            if connection.state != "ready":
                continue
            for tool in self._connection_tools(connection):
                if tool.exposed in taken:
                    log.warning(
                        "mcp.name_clash server=%s tool=%s: %s is taken; not offered",
                        connection.name,
                        tool.remote,
                        tool.exposed,
                    )
                    continue
                taken.add(tool.exposed)
                offered.append(tool)
        self._offered[key] = offered
        return offered

    def resolve(self, name: str, workspace: Path | None = None) -> Tool | None:
        """A tool by dotted or exposed name, also of a server that is down (its call then
        says why); None for a name no server lists (or the allow-list leaves out)."""
        for connection in self.connections(workspace):
            for tool in self._connection_tools(connection):
                if name in (tool.name, tool.exposed):
                    return tool
        return None

    def overview(
        self, workspace: Path | None = None, reserved: set[str] | None = None
    ) -> list[ServerOverview]:
        """Every configured server with its state and offered tools, in config order."""
        offered = self.tools(workspace, reserved)
        by_server: dict[str, list[Tool]] = {}
        for tool in offered:
            by_server.setdefault(tool.server, []).append(tool)  # type: ignore[attr-defined]
        running = {c.name: c for c in self.connections(workspace)}
        found = []
        for config in self.servers:
            connection = running.get(config.name)
            if connection is None:
                found.append(
                    ServerOverview(
                        config.name,
                        config.transport,
                        config.target,
                        "disabled" if not config.enabled else "stopped",
                        "",
                        [],
                    )
                )
                continue
            detail = ""
            if connection.state == "down":
                detail = connection.error or "disconnected"
                if connection.retry_at is not None:
                    wait = max(0.0, connection.retry_at - time.monotonic())
                    detail += f"; retrying in {wait:.0f} s"
            elif connection.state == "starting" and connection.error:
                detail = f"restarting after: {connection.error}"
            found.append(
                ServerOverview(
                    config.name,
                    config.transport,
                    config.target,
                    connection.state,
                    detail,
                    by_server.get(config.name, []),
                    connection.restarts,
                )
            )
        return found

    def status(self) -> dict[str, dict[str, Any]]:
        """Each server's state for /readyz (default workspace; instances for other
        workspaces are counted). /readyz needs no token, so it says whether a server has a
        problem but not what: a server's stderr may carry anything (connection strings);
        the full text is in the log and in `bub-bot doctor`."""
        out: dict[str, dict[str, Any]] = {}
        for item in self.overview():
            instances = sum(1 for key in self._connections if key[0] == item.name)
            out[item.name] = {
                "transport": item.transport,
                "state": item.state,
                "tools": len(item.tools),
                "restarts": item.restarts,
                "error": "see the log (mcp.start_failed / mcp.down)" if item.detail else None,
                "instances": instances,
            }
        return out
