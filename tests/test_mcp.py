"""MCP tools end to end: real MCP servers (tests/mcp_servers, official SDK) over stdio and
Streamable HTTP on loopback, the real bot (runtime, agent loop, tape) and the fake model."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bub_bot.agent import ToolContext
from bub_bot.config import Settings
from bub_bot.server import Bot, BotServer
from bub_bot.tape import Tape
from channels.cli import CliChannel
from tests import runtime_channel, test_cli
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.mcp_servers.http_server import serve_http
from tests.mcp_servers.tools_server import big_text
from tests.serve_process import free_port

SERVER = Path(__file__).parent / "mcp_servers" / "tools_server.py"
STDIO = {"command": sys.executable, "args": [str(SERVER)]}
TOKEN = "mcp-test-token-4f9a"


def write_config(tmp_path: Path, servers: dict[str, Any]) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    return path


until = partial(
    runtime_channel.until, timeout=15.0, interval=0.02
)  # the servers run in the background


async def say(bot: Bot, channel: CliChannel, message: str, session: str = "mcp") -> str:
    inbound = channel.inbound(message, session)
    await bot.runtime.receive(inbound)
    await bot.runtime.wait_idle(inbound.session_id, timeout=30)
    return channel.sent[-1]


def tools_offered(fake: FakeOpenAI, index: int = -1) -> dict[str, dict[str, Any]]:
    body = fake.completion_requests()[index].body
    return {t["function"]["name"]: t["function"] for t in body.get("tools", [])}


def tool_results(fake: FakeOpenAI, index: int = -1) -> list[Any]:
    messages = fake.completion_requests()[index].body["messages"]
    return [m["content"] for m in messages if m["role"] == "tool"]


async def tape_text(bot: Bot) -> str:
    """Every entry of every tape, as JSON (to check what reached the disk)."""
    found = []
    for row in await bot.store.list_tapes(include_all=True):
        found += [
            json.dumps(e.to_json(), ensure_ascii=False) for e in await bot.store.query(row.name)
        ]
    return "\n".join(found)


def alive(pid: int) -> bool:
    """The process exists (a zombie counts: it was not reaped)."""
    return Path(f"/proc/{pid}").exists()


@pytest.fixture
async def http_url():
    async with serve_http(TOKEN) as url:
        yield url


class Bots:
    """Opens bots with a CLI channel and an MCP config; closes what a test left open."""

    def __init__(self, settings: Callable[..., Settings], tmp_path: Path) -> None:
        self.settings = settings
        self.tmp_path = tmp_path
        self.open: list[Bot] = []

    async def __call__(self, servers: dict[str, Any], **overrides: Any) -> tuple[Bot, CliChannel]:
        conf = self.settings(mcp_config=write_config(self.tmp_path, servers), **overrides)
        channel = CliChannel(out=io.StringIO())
        bot = await Bot.open(conf, [channel])
        self.open.append(bot)
        return bot, channel

    async def close(self, bot: Bot) -> None:
        self.open.remove(bot)
        await bot.close()


@pytest.fixture
async def bot_factory(settings: Callable[..., Settings], tmp_path: Path):
    """`await bot_factory(servers, **settings)`: an opened bot; `bot_factory.close(bot)`."""
    bots = Bots(settings, tmp_path)
    yield bots
    for bot in list(bots.open):
        await bots.close(bot)


async def test_stdio_call_reaches_the_server_and_its_result_the_model(
    fake_openai, bot_factory, workspace, monkeypatch
) -> None:
    greeting = "hello-from-the-environment-42"
    monkeypatch.setenv("MCP_TEST_GREETING", greeting)
    bot, channel = await bot_factory(
        {"local": {**STDIO, "env": {"GREETING": "${MCP_TEST_GREETING}", "PLAIN": "${NOPE:-x}"}}}
    )
    fake_openai.script(
        tool_calls(
            [
                ("mcp_local_add", {"a": 2, "b": 40}),
                ("mcp_local_env_digest", {"name": "GREETING"}),
                ("mcp_local_info", {}),
                ("mcp_local_env", {"name": "GREETING"}),
                ("mcp_local_env", {"name": "PLAIN"}),
            ]
        ),
        text("all done"),
    )
    assert await say(bot, channel, "use the tools") == "all done"

    offered = tools_offered(fake_openai, 0)
    add = offered["mcp_local_add"]
    assert add["description"] == "Add two integers."
    assert add["parameters"]["properties"]["a"]["type"] == "integer"
    assert sorted(add["parameters"]["required"]) == ["a", "b"]
    assert {"tape_info", "fs_read", "spill_read"} <= set(offered)  # built-ins stay
    system = fake_openai.completion_requests()[0].body["messages"][0]["content"]
    assert "- mcp_local_add: Add two integers." in system

    added, digest, info, env, plain = tool_results(fake_openai)
    assert added == "42"
    assert digest == hashlib.sha256(greeting.encode()).hexdigest()  # ${VAR} expanded
    assert json.loads(info)["cwd"] == str(workspace.resolve())  # started in the workspace
    assert env == "[redacted]" and plain == "x"  # a value from env never reaches the model

    recorded = await tape_text(bot)
    assert '"arguments": "{\\"a\\": 2, \\"b\\": 40}"' in recorded  # the call, as the model wrote it
    assert greeting not in recorded
    pid = json.loads(info)["pid"]
    assert alive(pid)
    await bot_factory.close(bot)
    assert not alive(pid)  # terminated and reaped: no zombie


async def test_http_errors_timeouts_and_rich_results(
    http_url, fake_openai, bot_factory, monkeypatch
):
    monkeypatch.setenv("MCP_TEST_TOKEN", TOKEN)
    server = {"url": http_url, "headers": {"Authorization": "Bearer ${MCP_TEST_TOKEN}"}}
    # 3 s, not less: the calls run at once, and on a loaded 2-core machine the quick ones
    # must not run into the timeout that the nap is there to hit.
    bot, channel = await bot_factory({"remote": {**server, "timeout": 3}})
    fake_openai.script(
        tool_calls(
            [
                ("mcp_remote_fail", {"why": "badly"}),
                ("mcp_remote_nap", {"seconds": 30}),
                ("mcp_remote_echo", {"wrong": 1}),
                ("mcp_remote_picture", {}),
                ("mcp_remote_link", {}),
                ("mcp_remote_stats", {}),
                ("mcp_remote_echo", {"text": "still fine"}),
            ]
        ),
        text("done"),
    )
    assert await say(bot, channel, "go") == "done"
    failed, slow, invalid, picture, link, stats, echo = tool_results(fake_openai)
    assert failed.startswith("error: ") and "the tool broke badly" in failed
    assert slow == "error: nap on MCP server 'remote' did not answer within 3 s"
    assert invalid.startswith("error: ") and "text" in invalid  # the server's validation
    assert picture.startswith("a red pixel\n[image result: image/png, 70 bytes;")
    assert (
        link
        == "[resource link] report: file:///srv/report.pdf (application/pdf) — the quarterly report"
    )
    assert json.loads(stats) == {"count": 3, "items": ["a", "b"]}
    assert echo == "still fine"
    (results,) = [
        json.loads(line)["payload"]["results"]
        for line in (await tape_text(bot)).splitlines()
        if json.loads(line)["kind"] == "tool_result"
    ]
    assert [r.get("ok") for r in results] == [False, False, False, True, True, True, True]
    assert TOKEN not in await tape_text(bot)


async def test_calls_of_one_step_run_concurrently(http_url, fake_openai, bot_factory):
    bot, channel = await bot_factory(
        {"remote": {"url": http_url, "headers": {"Authorization": f"Bearer {TOKEN}"}}}
    )
    # Each call answers "met" only when all three are in flight at the same time.
    meet = ("mcp_remote_meet", {"group": "step", "count": 3})
    fake_openai.script(tool_calls([meet, meet, meet]), text("together"))
    assert await say(bot, channel, "meet") == "together"
    assert tool_results(fake_openai) == ["met", "met", "met"]


async def test_allow_list_hides_and_refuses_other_tools(http_url, fake_openai, bot_factory):
    bot, channel = await bot_factory(
        {
            "remote": {
                "url": http_url,
                "headers": {"Authorization": f"Bearer {TOKEN}"},
                "tools": ["echo"],
            }
        }
    )
    fake_openai.script(
        tool_calls([("mcp_remote_hidden", {}), ("mcp_remote_echo", {"text": "ok"})]), text("done")
    )
    await say(bot, channel, "try")
    assert [n for n in tools_offered(fake_openai, 0) if n.startswith("mcp_")] == ["mcp_remote_echo"]
    hidden, echo = tool_results(fake_openai)
    assert hidden.startswith("error: unknown tool 'mcp_remote_hidden'")
    assert echo == "ok"


async def test_list_changed_offers_the_new_tool(http_url, fake_openai, bot_factory):
    bot, channel = await bot_factory(
        {"remote": {"url": http_url, "headers": {"Authorization": f"Bearer {TOKEN}"}}}
    )
    fake_openai.script(tool_calls([("mcp_remote_grow", {})]), text("grown"))
    await say(bot, channel, "grow")
    assert "mcp_remote_extra" not in tools_offered(fake_openai, 0)
    assert bot.mcp is not None
    await until(lambda: any(t.exposed_name == "mcp_remote_extra" for t in bot.mcp.tools()))
    fake_openai.script(tool_calls([("mcp_remote_extra", {})]), text("used it"))
    assert await say(bot, channel, "use the new one") == "used it"
    assert "mcp_remote_extra" in tools_offered(fake_openai, -2)
    assert tool_results(fake_openai)[-1] == "extra here"


async def test_a_one_megabyte_result_is_spilled_and_pages_back_exactly(
    http_url, fake_openai, bot_factory
):
    size = 1_000_000
    bot, channel = await bot_factory(
        {"remote": {"url": http_url, "headers": {"Authorization": f"Bearer {TOKEN}"}}}
    )

    def model(body: dict[str, Any]) -> Any:
        # The "model" calls the tool, then reads the first pages of the spilled output.
        last = body["messages"][-1]
        if last["role"] != "tool":
            return tool_calls([("mcp_remote_big", {"size": size})])
        spilled = re.search(r"output spilled as (sp_[0-9a-f]+)", last["content"])
        if spilled:
            return tool_calls([("spill_read", {"handle": spilled.group(1), "count": 4})])
        return text("read the start")

    fake_openai.default = model
    assert await say(bot, channel, "fetch the big one") == "read the start"
    preview = tool_results(fake_openai, 1)[0]
    assert len(preview) < 2000 and preview.startswith(big_text(size)[:200])
    handle = re.search(r"output spilled as (sp_[0-9a-f]+)", preview).group(1)
    header, _, first = tool_results(fake_openai, 2)[1].partition("\n")
    assert json.loads(header)["chunks"] == [0, 3]

    # Page through the whole output with the model's tool: it comes back exactly.
    tape = Tape.for_session(bot.store, "cli:mcp", bot.settings.workspace)
    ctx = ToolContext(tape=tape, workspace=bot.settings.workspace, settings=bot.settings)
    pages, cursor = [], 0
    while cursor is not None:
        args = json.dumps({"handle": handle, "cursor": cursor, "count": 4})
        ok, out = await bot.agent.tools.call(ctx, "spill.read", args)
        assert ok
        header, _, page = out.partition("\n")
        pages.append(page)
        cursor = json.loads(header)["next_cursor"]
    assert pages[0] == first
    assert "".join(pages) == big_text(size)


async def test_killed_stdio_server_is_restarted_and_works_again(
    fake_openai, bot_factory, tmp_path, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="bub_bot.mcp")
    script = tmp_path / "server_copy.py"
    script.write_bytes(SERVER.read_bytes())
    bot, channel = await bot_factory({"local": {"command": sys.executable, "args": [str(script)]}})
    fake_openai.script(tool_calls([("mcp_local_info", {})]), text("first"))
    await say(bot, channel, "who are you")
    first_pid = json.loads(tool_results(fake_openai)[0])["pid"]
    assert bot.mcp is not None
    status = bot.mcp.status

    # Killed, and its script gone for a while: the restart fails and says why.
    hidden = script.rename(tmp_path / "elsewhere.py")
    os.kill(first_pid, signal.SIGKILL)
    await until(lambda: status()["local"]["restarts"] >= 1 and status()["local"]["state"] == "down")
    assert status()["local"]["error"].startswith("see the log")  # /readyz needs no token
    assert any("can't open file" in r.getMessage() for r in caplog.records)
    fake_openai.script(tool_calls([("mcp_local_echo", {"text": "x"})]), text("meanwhile"))
    await say(bot, channel, "now?")
    assert "mcp_local_echo" not in tools_offered(fake_openai, -2)
    (refused,) = tool_results(fake_openai)[-1:]
    assert refused.startswith("error: MCP server 'local' is not available (")
    # A short reason: the server's stderr (which may carry anything) stays in the log.
    assert "can't open file" not in refused and "retrying in" in refused

    hidden.rename(script)
    await until(lambda: status()["local"]["state"] == "ready")
    fake_openai.script(tool_calls([("mcp_local_info", {})]), text("again"))
    assert await say(bot, channel, "and now") == "again"
    second_pid = json.loads(tool_results(fake_openai)[-1])["pid"]
    assert second_pid != first_pid and alive(second_pid) and not alive(first_pid)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("mcp.down server=local") and "exited" in m for m in messages)
    assert any(m.startswith("mcp.start_failed server=local") for m in messages)


async def test_servers_that_never_start_leave_the_bot_serving(
    fake_openai, settings, tmp_path, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="bub_bot.mcp")
    crash = "import sys; sys.stderr.write('missing WIDGET_API_KEY\\n'); sys.exit(3)"
    config = write_config(
        tmp_path,
        {
            "broken": {"command": sys.executable, "args": ["-c", crash]},
            "absent": {"command": str(tmp_path / "no-such-server")},
            "off": {**STDIO, "enabled": False},
        },
    )
    channel = CliChannel(out=io.StringIO())
    bot = await Bot.open(settings(mcp_config=config), [channel])
    server = BotServer(bot, host="127.0.0.1", port=0)
    await server.start()
    try:
        assert bot.mcp is not None
        await until(
            lambda: all(s["restarts"] >= 1 for n, s in bot.mcp.status().items() if n != "off")
        )
        async with aiohttp.ClientSession() as http, http.get(server.url + "/readyz") as resp:
            assert resp.status == 200
            ready = await resp.json()
        mcp = ready["mcp"]
        assert mcp["off"]["state"] == "disabled"
        assert mcp["broken"]["tools"] == 0 and mcp["broken"]["state"] in ("down", "starting")
        fake_openai.script(text("still here"))
        assert await say(bot, channel, "hello") == "still here"
        assert not [n for n in tools_offered(fake_openai) if n.startswith("mcp_")]
        reply = await say(bot, channel, "/tools")
    finally:
        await server.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert any("server=broken" in m and "missing WIDGET_API_KEY" in m for m in messages)
    assert any("server=absent" in m and "command not found" in m for m in messages)
    assert "MCP server off (stdio): disabled" in reply
    assert "MCP server broken (stdio): " in reply and "tape_info" in reply
    # Every chat member sees /tools (and it is on the tape): the state and a short reason,
    # never what a server wrote to stderr (it may carry anything: the log has it).
    assert "WIDGET_API_KEY" not in reply and "stderr" not in reply


async def test_tools_command_lists_built_in_and_mcp_tools(http_url, fake_openai, bot_factory):
    bot, channel = await bot_factory(
        {
            "remote": {
                "url": http_url,
                "headers": {"Authorization": f"Bearer {TOKEN}"},
                "tools": ["echo", "add"],
            }
        }
    )
    reply = await say(bot, channel, "/tools")
    assert reply.startswith("The model has ")
    lines = reply.splitlines()
    assert "- tape_info — Facts about this conversation's tape" in reply
    head = "MCP server remote (http): ready, 2 tools"
    assert head in lines
    after = lines[lines.index(head) + 1 :]
    assert after[:2] == [
        "- mcp_remote_echo — Echo the text back.",
        "- mcp_remote_add — Add two integers.",
    ]
    assert not fake_openai.completion_requests()  # a command, not a model call


async def test_tools_command_without_mcp_and_its_usage(fake_openai, settings) -> None:
    channel = CliChannel(out=io.StringIO())
    bot = await Bot.open(settings(), [channel])
    try:
        reply = await say(bot, channel, "/tools")
        builtin = len(bot.agent.tools.own())
        assert reply.startswith(f"The model has {builtin} tools in this conversation.")
        assert "MCP server" not in reply
        assert await say(bot, channel, "/tools please") == (
            "tools takes no arguments. Usage: /tools — the tools the model has here"
            " (built-in and MCP servers)"
        )
        assert "/tools — the tools the model has here" in await say(bot, channel, "/help")
    finally:
        await bot.close()


async def test_doctor_connects_each_server(settings, tmp_path, http_url) -> None:
    from bub_bot.doctor import doctor

    config = write_config(
        tmp_path,
        {
            "local": {**STDIO, "tools": ["echo", "add"]},
            "remote": {"url": http_url, "headers": {"Authorization": f"Bearer {TOKEN}"}},
            "locked": {"url": http_url},
            "absent": {"command": str(tmp_path / "no-such-server")},
        },
    )
    out = io.StringIO()
    code = await doctor(settings(mcp_config=config), out=out)
    lines = {line.split()[1]: line for line in out.getvalue().splitlines() if "mcp:" in line}
    assert code == 1
    assert (
        lines["mcp:local"].startswith("ok ")
        and "2 tools (allow-listed): echo, add" in lines["mcp:local"]
    )
    assert lines["mcp:remote"].startswith("ok ") and "14 tools: echo, add," in lines["mcp:remote"]
    locked = lines["mcp:locked"]
    assert locked.startswith("FAIL") and "HTTP 401 Unauthorized (check the headers)" in locked
    assert '"url" and "headers"' in locked
    assert lines["mcp:absent"].startswith("FAIL") and "command not found" in lines["mcp:absent"]
    assert TOKEN not in out.getvalue()


def cli_env(fake: FakeOpenAI, tmp_path: Path, config: Path) -> dict[str, str]:
    return {**test_cli.cli_env(fake, tmp_path), "BUB_MCP_CONFIG": str(config)}


async def bub(*args: str, env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    return await test_cli.bub(*args, env=env, cwd=cwd, timeout=60)


async def test_run_uses_a_stdio_server_and_leaves_no_process_behind(fake_openai, tmp_path):
    env = cli_env(fake_openai, tmp_path, write_config(tmp_path, {"local": STDIO}))
    fake_openai.script(tool_calls([("mcp_local_info", {})]), text("the server answered"))
    code, out, err = await bub("run", "ask the server", env=env, cwd=tmp_path)
    assert (code, out.strip()) == (0, "the server answered"), err
    info = json.loads(tool_results(fake_openai)[0])
    assert info["cwd"] == str((tmp_path / "ws").resolve())
    assert not alive(info["pid"])


async def test_a_broken_config_stops_the_start_with_one_line(fake_openai, tmp_path):
    config = write_config(tmp_path, {"local": {**STDIO, "url": "http://127.0.0.1:9/mcp"}})
    env = cli_env(fake_openai, tmp_path, config)
    code, out, err = await bub("run", "hi", env=env, cwd=tmp_path)
    assert code == 2 and out == ""
    assert err.strip() == (
        f"bub-bot: BUB_MCP_CONFIG: {config}: mcpServers.local: has both command (stdio) and url"
        " (HTTP); choose one"
    )
    assert not fake_openai.completion_requests()


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


async def test_serve_terminates_its_stdio_servers_on_sigterm(fake_openai, tmp_path):
    port = free_port()
    env = cli_env(fake_openai, tmp_path, write_config(tmp_path, {"a": STDIO}))
    env["PORT"] = str(port)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bub_bot",
        "serve",
        env=env,
        cwd=tmp_path,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        ready: dict[str, Any] = {}

        async def servers_ready() -> bool:
            nonlocal ready
            try:
                async with aiohttp.ClientSession() as http:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        ready = await resp.json()
            except aiohttp.ClientError:
                return False
            return [s["state"] for s in ready.get("mcp", {}).values()] == ["ready"]

        for _ in range(600):
            if await servers_ready():
                break
            assert proc.returncode is None
            await asyncio.sleep(0.05)
        assert ready["mcp"]["a"]["tools"] > 0
        servers = children(proc.pid)
        assert len(servers) == 1
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert not [pid for pid in servers if alive(pid)]
