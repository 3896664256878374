"""The reads of `query_many`: a `View` is one query, given as filters or as a function of the
results before it; `run_views` / `run_views_async` run them in order for a store that reads
synchronously (SQLite's thread) or on one connection (PostgreSQL)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from .entries import TapeEntry
from .query import QuerySpec

View = Mapping[str, Any] | Callable[[list[list[TapeEntry]]], Mapping[str, Any] | None]
"""One query of `query_many`: filters as for `query`, or a function of the results before it
that gives them (None: no query, an empty result)."""


def run_views(
    tape: str, views: Sequence[View], select: Callable[[QuerySpec], list[TapeEntry]]
) -> list[list[TapeEntry]]:
    """`query_many` for a store that reads synchronously (SQLite's thread): `select` each."""
    results: list[list[TapeEntry]] = []
    for view in views:
        filters = view(results) if callable(view) else view
        results.append([] if filters is None else select(QuerySpec.build(tape, **filters)))
    return results


async def run_views_async(
    tape: str, views: Sequence[View], select: Callable[[QuerySpec], Awaitable[list[TapeEntry]]]
) -> list[list[TapeEntry]]:
    """`query_many` for a store that reads asynchronously on one connection: `select` each."""
    results: list[list[TapeEntry]] = []
    for view in views:
        filters = view(results) if callable(view) else view
        results.append([] if filters is None else await select(QuerySpec.build(tape, **filters)))
    return results
