"""`bub-bot doctor`'s MCP check: connect a server once, list its tools, disconnect."""

from __future__ import annotations

from pathlib import Path

from ...mcp_config import McpServerConfig
from .connection import CONNECT_TIMEOUT, McpConnection

TOOLS_SHOWN = 12


async def probe_server(
    config: McpServerConfig, workspace: Path, timeout: float = CONNECT_TIMEOUT
) -> tuple[bool, str]:
    """(ok, one line): the tools a server offers after the allow-list, or why it failed."""
    if not config.enabled:
        return True, f"{config.transport} {config.target}: disabled in the config"
    connection = McpConnection(config, workspace.resolve())
    connection.start()
    try:
        await connection.wait_first(timeout)
        state, error, tools = connection.state, connection.error_detail, list(connection.tools)
    finally:
        await connection.close()
    where = f"{config.transport} {config.target}"
    if state != "ready":
        return False, f"{where}: {error or f'no connection within {timeout:g} s'}"
    names = [t.name for t in tools]
    shown = ", ".join(names[:TOOLS_SHOWN]) + (" …" if len(names) > TOOLS_SHOWN else "")
    allowed = " (allow-listed)" if config.tools is not None else ""
    count = f"{len(names)} tool" + ("" if len(names) == 1 else "s")
    return True, f"{where}: {count}{allowed}" + (f": {shown}" if names else "")
