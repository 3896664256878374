"""MCP tools: the servers of `BUB_MCP_CONFIG` offered to the model as `mcp.<server>.<tool>`.

`config` parses the file (cheap, no SDK import); `connection` runs one server instance with
the official `mcp` SDK over a `transport` (stdio child or Streamable HTTP); `manager` keeps the instances (by workspace for stdio servers) and is
the registry's tool source; `results` turns call results into what the model reads; `probe`
is `bub-bot doctor`'s check.
"""

from .config import McpServerConfig, load_mcp_config
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
