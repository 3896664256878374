"""Choosing a store from a database URL: `open_store("postgresql://…")`, `open_store(settings)`.

`sqlite:///path` (or a plain path) opens SQLite; `postgresql://…` or `postgres://…` opens
PostgreSQL (asyncpg is imported only then). URLs are shown without their password.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote, urlsplit

from .store import Opening, TapeStore

POSTGRES_SCHEMES = ("postgresql", "postgres")
DEFAULT_POOL_SIZE = 10
URL_FORMS = "sqlite:///path, a file path, postgresql://user:password@host:port/dbname"


class DatabaseSettings(Protocol):
    """What `open_store` reads from a settings object."""

    @property
    def database(self) -> str: ...

    database_pool_size: int


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


def open_store(
    target: str | Path | DatabaseSettings, *, pool_size: int | None = None
) -> Opening[TapeStore]:
    """Open the store a URL (or settings' `database`) names: await it or `async with` it.

    Raises ValueError for a malformed URL; opening raises TapeStoreError with one line naming
    the file or host when the database cannot be used.
    """
    if isinstance(target, str | Path):
        url = parse_database_url(target)
        size = pool_size or DEFAULT_POOL_SIZE
    else:
        url = parse_database_url(target.database)
        size = pool_size or target.database_pool_size
    if url.kind == "sqlite":
        from .sqlite import SQLiteTapeStore

        opening: Opening[Any] = SQLiteTapeStore.open(url.target)
        return opening
    from .postgres import PostgresTapeStore  # asyncpg is imported only for PostgreSQL

    return PostgresTapeStore.open(url.target, pool_size=size)
