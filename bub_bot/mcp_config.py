"""The MCP config file (`BUB_MCP_CONFIG`): the `mcpServers` format other MCP clients use.

```json
{"mcpServers": {
  "github": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
             "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "${GITHUB_TOKEN}"}},
  "search": {"url": "https://search.example.com/mcp",
             "headers": {"Authorization": "Bearer ${SEARCH_TOKEN}"},
             "tools": ["query"], "timeout": 20}
}}
```

Values of `command`, `args`, `env`, `url` and `headers` may use `${VAR}` (or `${VAR:-default}`)
from the process environment, so secrets stay out of the file. Any problem is one
`ConfigError` line naming the file, the place in it and what is wrong. This module does not
import the MCP SDK (parsing a config must stay cheap for every `bub-bot` command).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from .errors import ConfigError

DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 3600.0
SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]*:([^@\s/]+)@", re.I)
_SECRET_NAME = re.compile(r"token|key|secret|password|passwd|auth|cookie|credential|pat$", re.I)
_KEYS = {"command", "args", "env", "url", "headers", "tools", "timeout", "enabled", "type"}
# `type` as other clients write it; `sse` (the old HTTP+SSE transport) is refused clearly.
_TYPES = {"stdio": "stdio", "http": "http", "streamable-http": "http", "streamableHttp": "http"}


@dataclass(frozen=True)
class McpServerConfig:
    """One configured MCP server, `${VAR}`s already expanded.

    `secrets` are every `env` and `headers` value (literal or from `${VAR}`), a `${VAR}`
    named like a secret anywhere, and the password of every `scheme://user:pw@` in `args`,
    `env`, `url` and `headers`: they are scrubbed from every error, log line and result."""

    name: str
    transport: Literal["stdio", "http"]
    command: str = ""
    # repr=False: these may hold secrets (a DSN in args), and a repr ends up in logs
    args: tuple[str, ...] = field(default=(), repr=False)
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    url: str = field(default="", repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    tools: frozenset[str] | None = None
    """Allow-list of the server's tool names; None offers all."""
    timeout: float = DEFAULT_TIMEOUT
    enabled: bool = True
    secrets: tuple[str, ...] = field(default=(), repr=False)

    def allows(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools

    @property
    def target(self) -> str:
        """What the server is, for logs and /readyz (never a secret: no args, env, headers)."""
        if self.transport == "http":
            return _strip_query(self.url)
        return Path(self.command).name


def _strip_query(url: str) -> str:
    # A token may sit in the query string or user-info; the host and path are enough.
    base = url.split("?", 1)[0].split("#", 1)[0]
    scheme, sep, rest = base.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}"


class _Problem(Exception):
    """A problem at a place in the file (turned into one ConfigError line)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}" if where else message)


def load_mcp_config(
    path: str | Path | None, environ: Mapping[str, str] | None = None
) -> list[McpServerConfig]:
    """The servers of the file at `path` (an empty list when `path` is unset).

    Raises ConfigError: `BUB_MCP_CONFIG: <file>: <where>: <problem>`."""
    if path is None or str(path) == "":
        return []
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"BUB_MCP_CONFIG: cannot read {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"BUB_MCP_CONFIG: {file}: not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"BUB_MCP_CONFIG: {file}: invalid JSON at line {exc.lineno} column {exc.colno}:"
            f" {exc.msg}"
        ) from None
    try:
        return parse_mcp_config(data, os.environ if environ is None else environ)
    except _Problem as exc:
        raise ConfigError(f"BUB_MCP_CONFIG: {file}: {exc}") from None


def parse_mcp_config(data: Any, environ: Mapping[str, str]) -> list[McpServerConfig]:
    """The servers of an already decoded config document (raises _Problem)."""
    if not isinstance(data, dict):
        raise _Problem("", "the file must hold a JSON object with an mcpServers object")
    unknown = sorted(set(data) - {"mcpServers"})
    if unknown:
        raise _Problem("", f"unknown key {unknown[0]!r} (the file holds only mcpServers)")
    servers = data.get("mcpServers")
    if not isinstance(servers, dict):
        raise _Problem("mcpServers", "missing, or not an object of servers by name")
    return [_server(name, spec, environ) for name, spec in servers.items()]


def _server(name: str, spec: Any, environ: Mapping[str, str]) -> McpServerConfig:
    where = f"mcpServers.{name}"
    if not SERVER_NAME.fullmatch(name):
        raise _Problem(where, "server names are 1-40 letters, digits, _ or - (they name tools)")
    if not isinstance(spec, dict):
        raise _Problem(where, "must be an object")
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise _Problem(
            where, f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS - {'type'}))})"
        )
    secrets: list[str] = []

    def expand(value: str, at: str, *, secret: bool = False) -> str:
        """`value` with `${VAR}`s replaced; a value is secret when it lands in env/headers
        or its variable is named like one (GITHUB_TOKEN, API_KEY): `${HOME}` in args is not."""

        def one(match: re.Match[str]) -> str:
            var, default = match.group(1), match.group(2)
            if var in environ:
                found = environ[var]
            elif default is not None:
                return default
            else:
                raise _Problem(at, f"environment variable {var} is not set")
            if secret or _SECRET_NAME.search(var):
                secrets.append(found)
            return found

        expanded = _VAR.sub(one, value)
        # A connection string (`postgresql://app:pw@db/app` in args, as database MCP
        # servers take it) carries a password whatever its variable is called, and also
        # when it is written in the file literally.
        secrets.extend(url_passwords(expanded))
        return expanded

    def string(key: str, *, required: bool = False) -> str:
        value = spec.get(key)
        if value is None and not required:
            return ""
        if not isinstance(value, str) or not value.strip():
            raise _Problem(f"{where}.{key}", "must be a non-empty string")
        return expand(value, f"{where}.{key}")

    def mapping(key: str) -> dict[str, str]:
        value = spec.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise _Problem(f"{where}.{key}", "must be an object of strings")
        out = {}
        for k, v in value.items():
            expanded = expand(v, f"{where}.{key}.{k}", secret=True)
            # Every env and headers value is a secret, written literally or not (a DSN in
            # env, a token in a header); "Bearer <token>" also gives up its token alone.
            secrets.append(expanded)
            scheme, _, credential = expanded.partition(" ")
            if credential and scheme.isalpha():
                secrets.append(credential.strip())
            out[k] = expanded
        return out

    declared = spec.get("type")
    if declared is not None:
        if declared == "sse":
            raise _Problem(
                f"{where}.type", "the old HTTP+SSE transport is not supported; use Streamable HTTP"
            )
        if declared not in _TYPES:
            raise _Problem(f"{where}.type", f"must be one of {', '.join(_TYPES)}")
    if "command" in spec and "url" in spec:
        raise _Problem(where, "has both command (stdio) and url (HTTP); choose one")
    if "command" not in spec and "url" not in spec:
        raise _Problem(where, "needs command (a stdio server) or url (a Streamable HTTP server)")
    transport: Literal["stdio", "http"] = "stdio" if "command" in spec else "http"
    if declared is not None and _TYPES[declared] != transport:
        raise _Problem(f"{where}.type", f"is {declared!r} but the server has {_KEY[transport]}")

    enabled = spec.get("enabled", True)
    if not isinstance(enabled, bool):
        raise _Problem(f"{where}.enabled", "must be true or false")
    timeout = spec.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise _Problem(f"{where}.timeout", "must be a number of seconds")
    if not 0 < timeout <= MAX_TIMEOUT:
        raise _Problem(f"{where}.timeout", f"must be above 0 and at most {MAX_TIMEOUT:g} seconds")
    tools = spec.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools):
            raise _Problem(f"{where}.tools", "must be a list of tool names")
        tools = frozenset(tools)

    if transport == "stdio":
        if any(k in spec for k in ("headers",)):
            raise _Problem(f"{where}.headers", "headers are for url (HTTP) servers")
        args = spec.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise _Problem(f"{where}.args", "must be a list of strings")
        return McpServerConfig(
            name=name,
            transport="stdio",
            command=string("command", required=True),
            args=tuple(expand(a, f"{where}.args") for a in args),
            env=mapping("env"),
            tools=tools,
            timeout=float(timeout),
            enabled=enabled,
            secrets=_secret_values(secrets),
        )
    for key in ("args", "env"):
        if key in spec:
            raise _Problem(f"{where}.{key}", f"{key} is for command (stdio) servers")
    url = string("url", required=True)
    if not url.startswith(("http://", "https://")):
        raise _Problem(f"{where}.url", "must start with http:// or https://")
    try:
        password = urlsplit(url).password
    except ValueError:
        raise _Problem(f"{where}.url", "is not a valid URL") from None
    if password:
        secrets.append(password)
    return McpServerConfig(
        name=name,
        transport="http",
        url=url,
        headers=mapping("headers"),
        tools=tools,
        timeout=float(timeout),
        enabled=enabled,
        secrets=_secret_values(secrets),
    )


_KEY = {"stdio": "command", "http": "url"}


def url_passwords(text: str) -> list[str]:
    """Secrets of every `scheme://user:password@` in `text`: the password, and the whole
    `://user:password@` (so a short password is still redacted, with its context)."""
    found = []
    for match in _URL_PASSWORD.finditer(text):
        found.append(match.group(1))
        found.append(match.group(0)[match.group(0).index("://") :])
    return found


def _secret_values(values: list[str]) -> tuple[str, ...]:
    # Short values ("1", "true") are settings, not secrets; scrubbing them would garble text.
    return tuple(dict.fromkeys(v for v in values if len(v) >= 6))
