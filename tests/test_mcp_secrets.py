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
