"""MCP secrets that reach no page (found in review): a connection string passed to a stdio
server through ${VAR} in `args` is a secret whatever the variable is called, and the
unauthenticated /readyz never shows what a server wrote to stderr."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import aiohttp

from bub_bot.mcp_config import load_mcp_config
from tests.test_web import web

__all__ = ["web"]  # fixture

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
