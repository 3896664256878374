"""A context selector for the tests (BUB_CONTEXT_SELECTOR=tests.selector_last_two:select):
the default mapping, then only the last two messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bub_bot.tape import TapeEntry, default_selector


def select(entries: Sequence[TapeEntry]) -> list[dict[str, Any]]:
    """The default messages, the last two only."""
    return default_selector(entries)[-2:]


NOT_CALLABLE = 3
