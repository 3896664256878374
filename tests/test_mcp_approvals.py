"""MCP tools and approvals: a real MCP server (Streamable HTTP) whose `echo` is annotated
`readOnlyHint` and whose `add` is not; in a group conversation the read-only one runs at
once and the other waits for a click (the README's "a team's search tools need no click")."""

from __future__ import annotations

from bub_bot.server import Bot
from channels.base import ApprovalClick, Sender
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.test_approvals import ButtonChannel
from tests.test_mcp import TOKEN, http_url, until, write_config

__all__ = ["http_url"]  # the fixture
CHAT = "T1:C1:1.0"  # the channel is named "slack": session slack:T1:C1:1.0, a group


async def test_read_only_mcp_tools_need_no_click(
    settings, tmp_path, http_url, fake_openai: FakeOpenAI
):
    servers = {"remote": {"url": http_url, "headers": {"Authorization": f"Bearer {TOKEN}"}}}
    conf = settings(mcp_config=write_config(tmp_path, servers))
    channel = ButtonChannel()
    channel.name = "slack"
    bot = await Bot.open(conf, [channel])
    try:
        tools = bot.runtime.agent.tools
        await tools.prepare()
        echo, add = tools.get("mcp.remote.echo"), tools.get("mcp.remote.add")
        assert echo is not None and echo.read_only is True and echo.group == "mcp"
        assert add is not None and add.read_only is None
        fake_openai.script(
            tool_calls([("mcp_remote_echo", {"text": "hi"}), ("mcp_remote_add", {"a": 1, "b": 2})]),
            text("done"),
        )
        await bot.runtime.receive(channel.inbound("use them", CHAT))
        await until(lambda: len(channel.asked) == 1)
        request = channel.asked[0]
        assert [(c["tool"], c["policy"]) for c in request["calls"]] == [
            ("mcp.remote.echo", "allow"),
            ("mcp.remote.add", "ask"),
        ]
        assert "mcp.remote.add" in request["text"] and "mcp.remote.echo" not in request["text"]
        click = ApprovalClick(
            "slack", f"slack:{CHAT}", request["id"], request["digest"], "approve", Sender("u1")
        )
        assert await bot.runtime.decide(click) == "approve"
        await channel.wait_sent(CHAT, 2)
        await bot.runtime.wait_idle(f"slack:{CHAT}", 10)
        results = [m["content"] for m in fake_openai.last_messages() if m["role"] == "tool"]
        assert results == ["hi", "3"]
    finally:
        await bot.close()
