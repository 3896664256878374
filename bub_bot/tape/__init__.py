"""The tape model: append-only entries in a store (SQLite or PostgreSQL), anchors, handoffs
and context selection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .connect import open_store
from .context import Selector, default_selector, visible
from .entries import KINDS, PayloadError, TapeEntry, utc_now
from .fork import ForkTape, fork, open_fork
from .forks import ForkError, ForkPoint, Merged
from .names import archive_name, sidecar_name, tape_name
from .query import AnchorNotFound
from .sqlite import SQLiteTapeStore
from .store import (
    DedupeRecord,
    TapeStats,
    TapeStore,
    TapeStoreError,
    TapeSummary,
)
from .tape import BOOTSTRAP_ANCHOR, Tape, TapeInfo
from .urls import DatabaseURL, parse_database_url
from .usage import Counting, UsageAdd, UsageRow

if TYPE_CHECKING:
    from .postgres import PostgresTapeStore


def __getattr__(name: str) -> Any:
    # asyncpg is imported only when PostgreSQL is used.
    if name == "PostgresTapeStore":
        from .postgres import PostgresTapeStore

        return PostgresTapeStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BOOTSTRAP_ANCHOR",
    "KINDS",
    "AnchorNotFound",
    "Counting",
    "DatabaseURL",
    "DedupeRecord",
    "ForkError",
    "ForkPoint",
    "ForkTape",
    "Merged",
    "PayloadError",
    "PostgresTapeStore",
    "SQLiteTapeStore",
    "Selector",
    "Tape",
    "TapeEntry",
    "TapeInfo",
    "TapeStats",
    "TapeStore",
    "TapeStoreError",
    "TapeSummary",
    "UsageAdd",
    "UsageRow",
    "archive_name",
    "default_selector",
    "fork",
    "open_fork",
    "open_store",
    "parse_database_url",
    "sidecar_name",
    "tape_name",
    "utc_now",
    "visible",
]
