"""The tape model: append-only entries in SQLite, anchors, handoffs and context selection."""

from .context import Selector, default_selector, visible
from .entries import KINDS, PayloadError, TapeEntry, utc_now
from .names import archive_name, sidecar_name, tape_name
from .store import AnchorNotFound, SQLiteTapeStore, TapeStats, TapeStoreError, TapeSummary
from .tape import BOOTSTRAP_ANCHOR, Tape, TapeInfo

__all__ = [
    "BOOTSTRAP_ANCHOR",
    "KINDS",
    "AnchorNotFound",
    "PayloadError",
    "SQLiteTapeStore",
    "Selector",
    "Tape",
    "TapeEntry",
    "TapeInfo",
    "TapeStats",
    "TapeStoreError",
    "TapeSummary",
    "archive_name",
    "default_selector",
    "sidecar_name",
    "tape_name",
    "utc_now",
    "visible",
]
