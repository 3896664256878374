"""MCP tools: the servers of `BUB_MCP_CONFIG` offered to the model as `mcp.<server>.<tool>`.

The file is parsed with the settings, by `bub_bot.mcp_config` (cheap, no SDK import: a bad
file stops the start); `connection` runs one server instance with the official `mcp` SDK over
a `transport` (stdio child or Streamable HTTP); `manager` keeps the instances (by workspace for
stdio servers) and is the registry's tool source; `results` turns call results into what the model reads; `probe`
is `bub-bot doctor`'s check.
"""

from ...mcp_config import McpServerConfig, load_mcp_config
from .manager import McpManager, McpTool, ServerOverview, exposed_name
from .probe import probe_server

__all__ = [
    "McpManager",
    "McpServerConfig",
    "McpTool",
    "ServerOverview",
    "exposed_name",
    "load_mcp_config",
    "probe_server",
]
