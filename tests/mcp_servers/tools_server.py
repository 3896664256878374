"""A test MCP server: run as a script it speaks stdio; `build()` gives the server for HTTP.

Tools: echo, add, info (pid, working directory), env_digest and env (an environment
variable's SHA-256 / value), fail (raises), nap (sleeps), meet (answers once N calls are in
flight together), big (a deterministic text of any size), picture (text and a PNG), stats
(structured content only), link (a resource link), grow (adds a tool and says so), hidden
(for allow-lists).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, ImageContent, ResourceLink, TextContent, ToolAnnotations

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="
)


def big_text(size: int) -> str:
    """Exactly `size` characters, multi-byte ones included, the same every time."""
    line = "line {:07d} ünïcødé 数据 🙂 padding padding padding\n"
    parts, total, index = [], 0, 0
    while total < size:
        piece = line.format(index)
        parts.append(piece)
        total += len(piece)
        index += 1
    return "".join(parts)[:size]


def build(name: str = "tools") -> MCPServer:
    server = MCPServer(name, log_level="WARNING")

    # Annotated (MCP `ToolAnnotations`): read-only tools need no approval (README "Approvals").
    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def info() -> dict:
        """The server's process id and working directory."""
        return {"pid": os.getpid(), "cwd": os.getcwd()}

    @server.tool()
    def env_digest(name: str) -> str:
        """SHA-256 of an environment variable's value (or 'unset')."""
        value = os.environ.get(name)
        return "unset" if value is None else hashlib.sha256(value.encode()).hexdigest()

    @server.tool()
    def env(name: str) -> str:
        """An environment variable's value."""
        return os.environ.get(name, "unset")

    @server.tool()
    def fail(why: str = "on purpose") -> str:
        """Always raises (the SDK passes a ToolError's message on; other errors it hides)."""
        raise ToolError(f"the tool broke {why}")

    @server.tool()
    async def nap(seconds: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    in_flight: dict[str, int] = {}
    everyone_here: dict[str, asyncio.Event] = {}

    @server.tool()
    async def meet(group: str, count: int) -> str:
        """Wait until `count` calls of `group` are in flight at once ("met"), at most 10 s."""
        in_flight[group] = in_flight.get(group, 0) + 1
        event = everyone_here.setdefault(group, asyncio.Event())
        if in_flight[group] >= count:
            event.set()
        try:
            await asyncio.wait_for(event.wait(), 10)
        except TimeoutError:
            return "alone"
        return "met"

    @server.tool(structured_output=False)
    def big(size: int) -> str:
        """A deterministic text of `size` characters."""
        return big_text(size)

    @server.tool()
    def picture() -> list[TextContent | ImageContent]:
        """A caption and a 1x1 PNG."""
        return [
            TextContent(text="a red pixel"),
            ImageContent(data=base64.b64encode(PNG).decode(), mime_type="image/png"),
        ]

    @server.tool()
    def stats() -> CallToolResult:
        """Structured content only (no text block)."""
        return CallToolResult(content=[], structured_content={"count": 3, "items": ["a", "b"]})

    @server.tool()
    def link() -> list[ResourceLink]:
        """A link to a resource."""
        return [
            ResourceLink(
                name="report",
                uri="file:///srv/report.pdf",
                mime_type="application/pdf",
                description="the quarterly report",
            )
        ]

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add a tool named `extra` and tell the client the list changed."""

        @server.tool()
        def extra() -> str:
            """A tool that appeared later."""
            return "extra here"

        await ctx.request_context.session.send_tool_list_changed()
        return "grown"

    @server.tool()
    def hidden() -> str:
        """A tool an allow-list can leave out."""
        return "you should not see this"

    return server


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else "tools").run("stdio")
