"""Choosing a store from a database URL: `open_store("postgresql://…")`, `open_store(settings)`.

`sqlite:///path` (or a plain path) opens SQLite; `postgresql://…` or `postgres://…` opens
PostgreSQL (asyncpg is imported only then); `urls.py` parses the URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from .store import Opening, TapeStore
from .urls import parse_database_url

DEFAULT_POOL_SIZE = 10


class DatabaseSettings(Protocol):
    """What `open_store` reads from a settings object."""

    @property
    def database(self) -> str: ...

    database_pool_size: int


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
