"""BUB_MCP_CONFIG parsing: the mcpServers format, ${VAR} expansion, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bub_bot.agent.mcp import exposed_name, load_mcp_config
from bub_bot.config import ConfigError

ENV = {"GITHUB_TOKEN": "ghp_0123456789abcdef", "HOME": "/home/bub", "REGION": "eu"}


def write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


def test_stdio_and_http_servers_with_expansion(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "mcpServers": {
                "github": {
                    "command": "npx",
                    "args": ["-y", "server-github", "--home=${HOME}"],
                    "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "${GITHUB_TOKEN}", "MODE": "ro"},
                    "tools": ["search_issues"],
                    "timeout": 20,
                },
                "search": {
                    "type": "http",
                    "url": "https://search.example.com/${REGION}/mcp?key=${API_KEY:-none}",
                    "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"},
                },
                "off": {"command": "x", "enabled": False},
            }
        },
    )
    github, search, off = load_mcp_config(path, ENV)
    assert (github.transport, github.command) == ("stdio", "npx")
    assert github.args == ("-y", "server-github", "--home=/home/bub")
    assert github.env == {"GITHUB_PERSONAL_ACCESS_TOKEN": ENV["GITHUB_TOKEN"], "MODE": "ro"}
    assert github.tools == frozenset({"search_issues"}) and github.timeout == 20.0
    assert github.allows("search_issues") and not github.allows("delete_repo")
    assert github.secrets == (ENV["GITHUB_TOKEN"],)  # ${HOME} in args is not a secret
    assert search.transport == "http" and search.timeout == 60.0 and search.tools is None
    assert search.url == "https://search.example.com/eu/mcp?key=none"
    assert search.headers == {"Authorization": f"Bearer {ENV['GITHUB_TOKEN']}"}
    assert set(search.secrets) == {ENV["GITHUB_TOKEN"], f"Bearer {ENV['GITHUB_TOKEN']}"}
    assert search.target == "https://search.example.com/eu/mcp"  # no query (keys) in logs
    assert "ghp_" not in repr(search)
    assert off.enabled is False
    assert load_mcp_config(None) == [] and load_mcp_config("") == []


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        (
            "{not json",
            "invalid JSON at line 1 column 2: Expecting property name enclosed in double quotes",
        ),
        ([], "the file must hold a JSON object with an mcpServers object"),
        ({"servers": {}}, "unknown key 'servers' (the file holds only mcpServers)"),
        ({"mcpServers": []}, "mcpServers: missing, or not an object of servers by name"),
        (
            {"mcpServers": {"a.b": {"command": "x"}}},
            "mcpServers.a.b: server names are 1-40 letters, digits, _ or - (they name tools)",
        ),
        (
            {"mcpServers": {"a\n": {"command": "x"}}},
            "mcpServers.a\n: server names are 1-40 letters, digits, _ or - (they name tools)",
        ),
        ({"mcpServers": {"a": "npx"}}, "mcpServers.a: must be an object"),
        (
            {"mcpServers": {"a": {"command": "x", "url": "http://h/mcp"}}},
            "mcpServers.a: has both command (stdio) and url (HTTP); choose one",
        ),
        (
            {"mcpServers": {"a": {}}},
            "mcpServers.a: needs command (a stdio server) or url (a Streamable HTTP server)",
        ),
        (
            {"mcpServers": {"a": {"command": "x", "cwd": "/"}}},
            "mcpServers.a: unknown key 'cwd' (known: args, command, enabled, env, headers, timeout, tools, url)",
        ),
        (
            {"mcpServers": {"a": {"command": ""}}},
            "mcpServers.a.command: must be a non-empty string",
        ),
        (
            {"mcpServers": {"a": {"command": "x", "args": "-y"}}},
            "mcpServers.a.args: must be a list of strings",
        ),
        (
            {"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}},
            "mcpServers.a.env: must be an object of strings",
        ),
        (
            {"mcpServers": {"a": {"command": "x", "env": {"K": "${MISSING_VAR}"}}}},
            "mcpServers.a.env.K: environment variable MISSING_VAR is not set",
        ),
        (
            {"mcpServers": {"a": {"command": "x", "timeout": "60"}}},
            "mcpServers.a.timeout: must be a number of seconds",
        ),
        (
            {"mcpServers": {"a": {"command": "x", "timeout": 0}}},
            "mcpServers.a.timeout: must be above 0 and at most 3600 seconds",
        ),
        (
            {"mcpServers": {"a": {"command": "x", "enabled": "no"}}},
            "mcpServers.a.enabled: must be true or false",
        ),
        (
            {"mcpServers": {"a": {"command": "x", "tools": "echo"}}},
            "mcpServers.a.tools: must be a list of tool names",
        ),
        (
            {"mcpServers": {"a": {"command": "x", "headers": {}}}},
            "mcpServers.a.headers: headers are for url (HTTP) servers",
        ),
        (
            {"mcpServers": {"a": {"url": "http://h/mcp", "args": []}}},
            "mcpServers.a.args: args is for command (stdio) servers",
        ),
        (
            {"mcpServers": {"a": {"url": "ftp://h/mcp"}}},
            "mcpServers.a.url: must start with http:// or https://",
        ),
        (
            {"mcpServers": {"a": {"url": "http://h/mcp", "type": "sse"}}},
            "mcpServers.a.type: the old HTTP+SSE transport is not supported; use Streamable HTTP",
        ),
        (
            {"mcpServers": {"a": {"url": "http://h/mcp", "type": "stdio"}}},
            "mcpServers.a.type: is 'stdio' but the server has url",
        ),
    ],
)
def test_a_broken_config_is_one_line_naming_the_file_and_the_place(
    tmp_path: Path, doc: Any, problem: str
) -> None:
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError) as caught:
        load_mcp_config(path, ENV)
    assert str(caught.value) == f"BUB_MCP_CONFIG: {path}: {problem}"


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_mcp_config(tmp_path / "missing.json", ENV)
    assert str(caught.value) == (
        f"BUB_MCP_CONFIG: cannot read {tmp_path / 'missing.json'}: No such file or directory"
    )


def test_tool_names_are_mangled_like_the_built_in_ones() -> None:
    assert exposed_name("github", "search_issues") == "mcp_github_search_issues"
    assert exposed_name("docs", "pages.get/v2") == "mcp_docs_pages_get_v2"
    long = exposed_name("server", "x" * 100)
    assert len(long) == 64 and long.startswith("mcp_server_xxx")
    assert long != exposed_name("server", "x" * 99)
