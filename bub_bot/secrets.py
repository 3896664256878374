"""Secrets policy in one place: which settings are secret, scrubbing their values from text,
and which workspace files the model's file tools never open."""

from __future__ import annotations

import re
from collections.abc import Iterable
from fnmatch import fnmatchcase
from pathlib import PurePath
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel

from .errors import ConfigError
from .mcp_config import load_mcp_config

REDACTED = "[redacted]"
MIN_SECRET_LENGTH = 6
"""Shorter values are not scrubbed: replacing every "abc" in tool output helps nobody."""

# A setting is secret by its name, so a future `BUB_*_TOKEN` / `*_SECRET` / `*_KEY` /
# `*_PASSWORD` is covered without touching this file; `*_URL` settings give up the
# password of their user-info part (postgresql://user:password@host/db).
_SECRET_SETTING = re.compile(r"(?:^|_)(?:token|key|secret|password)$")
_URL_SETTING = re.compile(r"(?:^|_)url$")


def secret_setting_names(settings: BaseModel) -> list[str]:
    """The names of the settings whose values are secret."""
    return [name for name in type(settings).model_fields if _SECRET_SETTING.search(name)]


def secrets_of(settings: BaseModel) -> list[str]:
    """The configured secret values: every secret setting, the secret half of a Telegram
    token (`<bot id>:<secret>`), and passwords inside URL settings."""
    values: list[str] = []
    for name in type(settings).model_fields:
        value = getattr(settings, name, None)
        if not isinstance(value, str) or not value:
            continue
        if _SECRET_SETTING.search(name):
            values.append(value)
            if name == "telegram_token" and ":" in value:
                values.append(value.split(":", 1)[1])
        elif _URL_SETTING.search(name) and "@" in value:
            try:
                password = urlsplit(value).password
            except ValueError:
                password = None
            if password:
                values.append(password)
    return [v for v in dict.fromkeys(values) if len(v) >= MIN_SECRET_LENGTH]


_USERINFO = re.compile(r"([a-z][a-z0-9+.-]*://[^/\s:@]*):[^@\s/]+@", re.I)


def redact_url_passwords(text: str) -> str:
    """`text` with the password of every `scheme://user:password@` replaced (for texts
    that may quote a connection string nobody configured as a secret)."""
    return _USERINFO.sub(lambda m: f"{m.group(1)}:{REDACTED}@", text)


def mcp_secrets(settings: BaseModel) -> list[str]:
    """The secrets of every server of BUB_MCP_CONFIG (none when unset or unreadable: the
    settings check reports a broken file)."""
    path = getattr(settings, "mcp_config", None)
    if path is None or str(path) == "":
        return []
    try:
        servers = load_mcp_config(path)
    except ConfigError:
        return []
    return [s for server in servers for s in server.secrets]


def known_secrets(settings: BaseModel) -> list[str]:
    """`secrets_of(settings)` and `mcp_secrets(settings)`, once each."""
    return list(dict.fromkeys([*secrets_of(settings), *mcp_secrets(settings)]))


class Scrubber:
    """Replaces configured secret values with `[redacted]` in text and JSON-like values."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # Longest first, so a secret that contains another one is replaced whole.
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.pattern = (
            re.compile("|".join(re.escape(s) for s in self.secrets)) if self.secrets else None
        )
        """The secrets as one alternation, longest first (None without secrets)."""

    @classmethod
    def for_settings(cls, settings: BaseModel) -> Scrubber:
        """A scrubber for every secret `settings` holds, and every MCP server's (the union:
        one server's token coming out of another server, or out of a file, is redacted)."""
        return cls(known_secrets(settings))

    def __bool__(self) -> bool:
        return self.pattern is not None

    def text(self, text: str) -> str:
        """`text` with every secret replaced."""
        if self.pattern is None or not text:
            return text
        return self.pattern.sub(REDACTED, text)

    @property
    def longest(self) -> int:
        """The length of the longest secret (0 without secrets)."""
        return len(self.secrets[0]) if self.secrets else 0

    def text_in(self, text: str, before: str = "", after: str = "") -> str:
        """`text`, a slice of a longer text that goes on with `before` and `after` (each at
        least `longest - 1` characters where the text has them), with every part of a secret
        replaced, also of one that starts before the slice or ends after it: a secret split
        across two pages must not come out in two halves."""
        if self.pattern is None or not text:
            return text
        start, end = len(before), len(before) + len(text)
        whole = before + text + after
        cuts = []
        for match in self.pattern.finditer(whole):
            if match.end() > start and match.start() < end:
                cuts.append((max(match.start(), start) - start, min(match.end(), end) - start))
        for lo, hi in reversed(cuts):
            text = text[:lo] + REDACTED + text[hi:]
        return text

    def value(self, value: Any) -> Any:
        """A copy of a JSON-like value (str, list, dict, scalars) with secrets replaced in
        every string, keys included; unchanged values are returned as they are."""
        if self.pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {
                (self.text(k) if isinstance(k, str) else k): self.value(v) for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value


# Names (matched case-insensitively against every part of a path) that may hold secrets:
# dotenv files, private keys and keystores, credential files of common tools, infra state,
# and the directories where tools keep credentials. `.git/` is refused whole: remote URLs
# in .git/config often carry tokens, and its objects hold whatever was ever committed.
SECRET_FILE_PATTERNS = (
    ".env",
    ".env.*",
    "*.env",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "*.ppk",
    "*.kdbx",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".npmrc",
    ".pypirc",
    ".git-credentials",
    ".htpasswd",
    ".dockercfg",
    "credentials",
    "credentials.json",
    "secrets",
    "secrets.*",
    "*.tfstate",
    "*.tfstate.*",
    "*.tfvars",
    ".git",
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    # Found missing in a review: tool credentials, cloud SDKs, shell and REPL histories.
    ".envrc",
    "credentials.*",
    "*credentials*.json",
    "service-account*.json",
    "*-sa.json",
    ".vault-token",
    ".my.cnf",
    ".mylogin.cnf",
    ".s3cfg",
    ".boto",
    ".terraformrc",
    "terraform.rc",
    ".terraform.d",
    "*.tfrc.json",
    "kubeconfig",
    "*.kubeconfig",
    ".gcloud",
    ".oci",
    ".password-store",
    ".authinfo*",
    ".bash_history",
    ".zsh_history",
    ".history",
    ".*_history",
    ".lesshst",
    ".viminfo",
    ".wget-hsts",
    ".pgpass.conf",
    ".config/gh",
    ".config/gcloud",
    # also refused on the security branch (issue 18 §4)
    ".credentials",
    "*service-account*.json",
    "*service_account*.json",
    "*.keytab",
    ".yarnrc.yml",
    ".histfile",
    "gh/hosts.yml",
    "gh/hosts.yaml",
    ".config/hub",
    ".config/rclone",
)
# Templates meant to be committed, without real values.
SECRET_FILE_EXCEPTIONS = (".env.example", ".env.sample", ".env.template", ".env.dist")


def secret_path_match(path: PurePath) -> str | None:
    """The pattern that makes `path` (relative to the workspace) a secret file, or None.

    A pattern with a `/` matches consecutive parts (`.config/gh` anywhere in the path)."""
    lowered = "/" + "/".join(part.lower() for part in path.parts) + "/"
    for pattern in SECRET_FILE_PATTERNS:
        if "/" in pattern and f"/{pattern}/" in lowered:
            return pattern
    for part in path.parts:
        name = part.lower()
        if name in SECRET_FILE_EXCEPTIONS:
            continue
        for pattern in SECRET_FILE_PATTERNS:
            if "/" not in pattern and fnmatchcase(name, pattern):
                return pattern
    return None


__all__ = [
    "REDACTED",
    "SECRET_FILE_PATTERNS",
    "Scrubber",
    "known_secrets",
    "mcp_secrets",
    "redact_url_passwords",
    "secret_path_match",
    "secret_setting_names",
    "secrets_of",
]
