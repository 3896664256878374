"""Usage counters in the store: one row per (key, window) with messages, tokens in and out,
cost and estimated tokens, added to atomically (an upsert that increments), so replicas on one
database share them and restarts keep them.

Keys: `u:<channel>:<user id>` (a person), `c:<session id>` (a conversation), `t` (the total),
`model:<name>`. Windows: `d:2026-12-02` (calendar day in BUB_TIMEZONE; tokens and messages),
`m:…T06:51`, `h:…T06`, `M:2026-12` (messages, only where a rate needs them). A month's tokens
are the sum of its days.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .entries import TapeEntry


@dataclass(frozen=True, slots=True)
class UsageAdd:
    """Amounts to add to one counter row (created at zero if missing)."""

    key: str
    window: str
    messages: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: int = 0
    """Micro-dollars."""
    estimated: int = 0
    """Tokens of these that were estimated from the text (the provider reported none)."""

    def values(self) -> tuple[Any, ...]:
        return (
            self.key,
            self.window,
            self.messages,
            self.tokens_in,
            self.tokens_out,
            self.cost,
            self.estimated,
        )


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One counter row as stored (or several summed: `window` is then the first one's)."""

    key: str
    window: str
    messages: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: int = 0
    estimated: int = 0

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


Decide = Callable[[list[int]], list[TapeEntry] | None]
"""Given each add's `messages` count after the adds (in the order of `Counting.adds`), the
entries to write instead of the append's (None: as they are). Runs inside the transaction."""


@dataclass(frozen=True, slots=True)
class Counting:
    """Counters an append adds in its own transaction, and an optional `decide` that may
    change what is written from the counts (a message over a rate is marked refused)."""

    adds: tuple[UsageAdd, ...]
    decide: Decide | None = None

    def sorted_adds(self) -> list[UsageAdd]:
        """Each (key, window) once, in one order (two transactions lock rows alike)."""
        merged: dict[tuple[str, str], list[int]] = {}
        for add in self.adds:
            total = merged.setdefault((add.key, add.window), [0] * 5)
            for i, v in enumerate(add.values()[2:]):
                total[i] += v
        return [UsageAdd(k, w, *v) for (k, w), v in sorted(merged.items())]

    def counts(self, found: dict[tuple[str, str], int]) -> list[int]:
        """`messages` after the adds per add, from the rows' new values."""
        return [found.get((a.key, a.window), 0) for a in self.adds]


COLUMNS = "key, win, messages, tokens_in, tokens_out, cost, estimated"


def row_usage(row: Any) -> UsageRow:
    return UsageRow(row[0], row[1], int(row[2]), int(row[3]), int(row[4]), int(row[5]), int(row[6]))
