"""MCP secrets that reach no page (issue 18 §1, §2, the union): a connection string passed
to a stdio server (through ${VAR} or literally) is a secret whatever it is called; every env
and headers value is one; one server's secret is redacted out of every server and fs.read;
/readyz and /tools never show what a server wrote to stderr (the log has it)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import aiohttp

from bub_bot.mcp_config import load_mcp_config
from tests.fakes.openai_server import text, tool_calls
from tests.test_mcp import STDIO, bot_factory, http_url, say, tape_text, tool_results, until
from tests.test_web import web

__all__ = ["bot_factory", "http_url", "web"]  # fixtures

DSN = "postgresql://app:Sup3rS3cretPw@db.internal:5432/app"


def test_a_password_in_a_connection_string_is_a_secret(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PG_DSN", DSN)
    config = tmp_path / "mcp.json"
    server = {"command": "postgres-mcp", "args": ["--dsn", "${PG_DSN}"]}
    config.write_text(json.dumps({"mcpServers": {"pg": server}}))
    [pg] = load_mcp_config(config)
    assert pg.args == ("--dsn", DSN)
    assert "Sup3rS3cretPw" in pg.secrets
    assert "Sup3rS3cretPw" not in repr(pg)


async def test_readyz_does_not_show_a_servers_stderr(web, tmp_path: Path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("PG_DSN", DSN)
    script = (
        "import sys; sys.stderr.write('could not connect to ' + sys.argv[1] + '\\n');"
        " sys.stderr.flush(); sys.exit(1)"
    )
    config = tmp_path / "mcp.json"
    server = {"command": sys.executable, "args": ["-c", script, "${PG_DSN}"]}
    config.write_text(json.dumps({"mcpServers": {"pg": server}}))
    w = await web(mcp_config=config)
    await w.bot.mcp.wait_started()
    for _ in range(100):
        if w.bot.mcp.status()["pg"]["state"] == "down":
            break
        await asyncio.sleep(0.05)
    async with aiohttp.ClientSession() as anon, anon.get(w.url + "/readyz") as resp:
        body = await resp.text()
    assert '"pg"' in body and '"down"' in body
    assert "Sup3rS3cretPw" not in body and "could not connect" not in body
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "could not connect to" in logged  # the operator still learns why
    assert "Sup3rS3cretPw" not in logged


def test_literal_env_headers_and_url_passwords_are_secrets(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    servers = {
        "db": {
            "command": "postgres-mcp",
            "args": ["--dsn", "postgresql://app:pw@db/app", "mysql://u:LiteralArgPw@h/d"],
            "env": {"DB_DSN": "postgresql://app:EnvLiteralPw@db/app", "MODE": "read-only-mode"},
        },
        "search": {
            "url": "https://bot:UrlPassw0rd@search.example.com/mcp",
            "headers": {"Authorization": "Bearer LiteralHeaderToken123", "X-Team": "team-alpha"},
        },
    }
    config.write_text(json.dumps({"mcpServers": servers}))
    db, search = load_mcp_config(config, environ={})
    for value in ("LiteralArgPw", "postgresql://app:EnvLiteralPw@db/app", "read-only-mode"):
        assert value in db.secrets
    assert "://app:pw@" in db.secrets  # a short password is redacted with its context
    for value in ("UrlPassw0rd", "Bearer LiteralHeaderToken123", "LiteralHeaderToken123"):
        assert value in search.secrets
    assert "team-alpha" in search.secrets


def test_one_union_scrubber_for_every_server_and_the_file_tools(tmp_path: Path, settings):
    from bub_bot.agent.mcp import McpManager
    from bub_bot.secrets import Scrubber

    config = tmp_path / "mcp.json"
    servers = {
        "a": {"command": "a-mcp", "env": {"A_TOKEN": "server-a-token-123"}},
        "b": {"url": "https://b.example.com/mcp", "headers": {"X-Key": "server-b-key-456"}},
    }
    config.write_text(json.dumps({"mcpServers": servers}))
    conf = settings(mcp_config=config)
    agent_scrub = Scrubber.for_settings(conf)
    text = "a says server-b-key-456, b says server-a-token-123, and sk-test"
    assert agent_scrub.text(text) == "a says [redacted], b says [redacted], and [redacted]"
    manager = McpManager(load_mcp_config(config, environ={}), tmp_path)
    assert manager.scrubber.text(text).count("[redacted]") == 2


def test_url_passwords_are_redacted_from_texts_nobody_configured() -> None:
    from bub_bot.secrets import redact_url_passwords

    text = "could not connect to postgresql://app:pw@db/app; also mysql://u:p%40ss@h:3306/x"
    assert redact_url_passwords(text) == (
        "could not connect to postgresql://app:[redacted]@db/app;"
        " also mysql://u:[redacted]@h:3306/x"
    )
    assert redact_url_passwords("https://example.com/a@b") == "https://example.com/a@b"


# -- end to end through a bot (ported from branch sec18b) --------------------------------

PASSWORD = "Lit3ralPgPassw0rd"
LITERAL_DSN = f"postgresql://app:{PASSWORD}@db.internal:5432/app"
WIDGET = "widget-literal-value-93c1"  # an env value under a name that looks harmless


async def test_one_servers_literal_secret_is_redacted_everywhere(
    fake_openai, bot_factory, workspace
) -> None:
    """Issue 18 §1 and the union: server a's literal env value comes out of a, out of
    server b and out of fs.read as [redacted], and the tape has only the scrubbed text."""
    (workspace / "notes.txt").write_text(f"the widget is {WIDGET}\n")
    bot, channel = await bot_factory({"a": {**STDIO, "env": {"WIDGET": WIDGET}}, "b": dict(STDIO)})
    fake_openai.script(
        tool_calls(
            [
                ("mcp_a_env", {"name": "WIDGET"}),
                ("mcp_b_echo", {"text": f"from b: {WIDGET}"}),
                ("fs_read", {"path": "notes.txt"}),
            ]
        ),
        text("done"),
    )
    assert await say(bot, channel, "use the tools") == "done"
    own, other, read = tool_results(fake_openai)
    assert WIDGET not in own and "[redacted]" in own
    assert WIDGET not in other and "[redacted]" in other  # server a's secret out of b
    assert WIDGET not in read and "[redacted]" in read  # and out of fs.read
    recorded = await tape_text(bot)
    assert '"content": "from b: [redacted]"' in recorded  # the tape has the scrubbed result


async def test_tools_shows_a_short_reason_and_the_log_the_stderr(
    fake_openai, bot_factory, caplog
) -> None:
    """Issue 18 §2: a server given a literal DSN in `args` dies saying it on stderr; /tools
    (every chat member, the tape) shows its state and a short reason, the log the stderr
    tail, and the password is in none of them."""
    caplog.set_level(logging.WARNING, logger="bub_bot.mcp")
    crash = (
        "import sys; sys.stderr.write('FATAL: could not connect to ' + sys.argv[1] + '\\n');"
        " sys.stderr.flush(); sys.exit(2)"
    )
    bot, channel = await bot_factory(
        {"pg": {"command": sys.executable, "args": ["-c", crash, LITERAL_DSN]}}
    )
    assert bot.mcp is not None
    await until(lambda: bot.mcp.status()["pg"]["restarts"] >= 1)
    reply = await say(bot, channel, "/tools")
    assert "MCP server pg (stdio): " in reply
    assert "Connection closed" in reply  # the state and a short reason
    assert "could not connect" not in reply and "stderr" not in reply
    assert PASSWORD not in reply
    recorded = await tape_text(bot)
    assert "could not connect" not in recorded and PASSWORD not in recorded
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "FATAL: could not connect to" in logged  # the operator still learns why
    assert PASSWORD not in logged


async def test_tools_keeps_an_http_status_in_the_short_reason(
    fake_openai, bot_factory, http_url
) -> None:
    """The short reason drops stderr only: an HTTP server refusing us says why in /tools."""
    bot, channel = await bot_factory({"locked": {"url": http_url}})
    assert bot.mcp is not None
    await until(lambda: bot.mcp.status()["locked"]["restarts"] >= 1)
    reply = await say(bot, channel, "/tools")
    assert "MCP server locked (http): " in reply
    assert "HTTP 401 Unauthorized (check the headers)" in reply


async def test_fs_read_in_a_turn_applies_the_agents_scrubber(
    tmp_path: Path, fake_openai, agent, tape, workspace
):
    """A turn's fs.read redacts with the agent's own scrubber (an MCP server's secret in it),
    also where a page cuts a secret in half: only the tool, which reads the text around its
    page, can tell that half is a secret (the loop's scrubbing of the result cannot)."""
    token = "server-a-token-123"
    config = tmp_path / "mcp.json"
    server = {"command": "a-mcp", "env": {"A_TOKEN": token}}
    config.write_text(json.dumps({"mcpServers": {"a": server}}))
    notes = f"before {token} after; also team-only-42"
    (workspace / "notes.txt").write_text(notes, "utf-8")
    bot = agent(mcp_config=config)
    assert token in bot.scrub.secrets  # the agent's scrubber knows the server's secret
    # The agent's scrubber, not one made from settings per call, is what the tool applies:
    # one that also knows a value no setting holds redacts its halves too.
    bot.scrub = type(bot.scrub)([*bot.scrub.secrets, "team-only-42"])
    middle = notes.index("team-only-42") + len("team-")
    fake_openai.script(
        tool_calls(
            [
                ("fs_read", {"path": "notes.txt", "limit": 14}),  # ends inside the token
                ("fs_read", {"path": "notes.txt", "offset": 14, "limit": middle - 14}),
                ("fs_read", {"path": "notes.txt", "offset": middle}),  # "only-42"
            ]
        ),
        text("read"),
    )
    result = await bot.run_turn(tape, [{"role": "user", "content": "read notes"}])
    assert result.status == "ok"
    messages = fake_openai.completion_requests()[1].body["messages"]
    pages = [m["content"].split("\n\n[fs_read")[0] for m in messages if m["role"] == "tool"]
    assert pages == ["before [redacted]", "[redacted] after; also [redacted]", "[redacted]"]
    sent = json.dumps([r.body for r in fake_openai.completion_requests()])
    stored = json.dumps([e.payload for e in await tape.query()])
    for part in ("server-a", "token-123", "team-", "only-42"):
        assert part not in sent and part not in stored
