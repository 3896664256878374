"""Database URLs: which store a URL names, and a form of it safe to print (no password).

`sqlite:///path` (or a plain path) names SQLite; `postgresql://…` or `postgres://…` names
PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

POSTGRES_SCHEMES = ("postgresql", "postgres")
URL_FORMS = "sqlite:///path, a file path, postgresql://user:password@host:port/dbname"


@dataclass(frozen=True, slots=True)
class DatabaseURL:
    """A parsed database URL: which store, the SQLite path or the full PostgreSQL URL, and a
    form safe to print (no password)."""

    kind: str  # "sqlite" | "postgresql"
    target: str  # SQLite: the file path; PostgreSQL: the URL as given
    display: str


def parse_database_url(url: str | Path) -> DatabaseURL:
    """Parse a database URL or path; ValueError (without the password) when it is not one."""
    text = str(url).strip()
    if not text:
        raise ValueError(f"empty database URL (use {URL_FORMS})")
    if "://" not in text:
        if text.startswith("sqlite:"):
            text = text[len("sqlite:") :]
        return DatabaseURL("sqlite", text, text)
    scheme = text.split("://", 1)[0].lower()
    if scheme == "sqlite":
        path = text[len("sqlite:///") :] if text.startswith("sqlite:///") else text[9:]
        if not path:
            raise ValueError("sqlite URL without a path (use sqlite:///path/to/bub.db)")
        return DatabaseURL("sqlite", path, path)
    if scheme not in POSTGRES_SCHEMES:
        raise ValueError(f"unsupported database URL scheme {scheme!r} (use {URL_FORMS})")
    try:
        parts = urlsplit(text)
        port = parts.port  # raises ValueError for a bad port
    except ValueError as exc:
        raise ValueError(f"invalid PostgreSQL URL {_redact(text)}: {exc}") from None
    host = parts.hostname or ""
    user = unquote(parts.username or "")
    where = f"{host}:{port}" if port else host
    auth = f"{quote(user, safe='')}@" if user else ""
    display = f"postgresql://{auth}{where}{parts.path or '/'}"
    return DatabaseURL("postgresql", text, display)


def _redact(text: str) -> str:
    """`text` with anything between `://` and the last `@` of the authority reduced to `***`."""
    head, _, rest = text.partition("://")
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    return f"{head}://{authority}{slash}{tail}"
