"""What both stores share: the operations of `TapeStore` written in terms of a few each store
implements (`_append`, `_reset`, `_append_copies`, `_select`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Self

from .entries import TapeEntry, safe_text, utc_now
from .leases import Leases, LocalLeases
from .names import archive_name
from .query import QuerySpec
from .rows import Append, Copies, Reset, Row, entry_row, with_ids
from .store import FirstEntries, TapeStoreError
from .usage import Counting
from .views import View


class StoreBase:
    """What both stores share: the operations written in terms of the others."""

    kind: str
    location: str
    schema_version: int
    transactions: int = 0
    """See `TapeStore.transactions`; each store adds one per round of work it runs."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        raise NotImplementedError

    def leases(self, owner: str, seconds: float) -> Leases:
        """One process on this database: every lease is granted (see TapeStore)."""
        return LocalLeases()

    async def append_many(
        self,
        tape: str,
        entries: Iterable[TapeEntry],
        *,
        dedupe_keys: Sequence[str] = (),
        if_no_anchor: bool = False,
        bootstrap: TapeEntry | None = None,
        session_id: str | None = None,
        usage: Counting | None = None,
    ) -> list[TapeEntry] | None:
        """Append entries in one transaction and return them with their ids (see TapeStore)."""
        entries = list(entries)
        chosen = entries
        decide = None
        if usage is not None and usage.decide is not None:
            ask = usage.decide

            def decide(found: dict[tuple[str, str], int]) -> list[Row] | None:
                nonlocal chosen
                replaced = ask(usage.counts(found))
                if replaced is None:
                    return None
                chosen = list(replaced)
                return [entry_row(e) for e in chosen]

        ids = await self._append(
            Append(
                tape,
                [entry_row(e) for e in entries],
                sorted({safe_text(k) for k in dedupe_keys}),
                if_no_anchor,
                entry_row(bootstrap) if bootstrap else None,
                safe_text(session_id) if session_id else None,
                usage.sorted_adds() if usage is not None else [],
                decide,
            )
        )
        return None if ids is None else with_ids(chosen, ids)

    async def _append(self, append: Append) -> list[int] | None:
        """The store's append transaction (see `Append`)."""
        raise NotImplementedError

    async def append_copies(
        self,
        tape: str,
        entries: Sequence[TapeEntry],
        *,
        session_id: str | None = None,
        updated: str | None = None,
    ) -> int:
        """Write entries copied from another store, ids and dates as they are (see TapeStore)."""
        entries = list(entries)
        await self._append_copies(
            Copies(
                tape,
                entries,
                [entry_row(e) for e in entries],
                safe_text(session_id) if session_id else None,
                updated or utc_now(),
            )
        )
        return len(entries)

    async def _append_copies(self, copies: Copies) -> None:
        """The store's copy transaction (see `Copies`)."""
        raise NotImplementedError

    async def reset(
        self,
        tape: str,
        *,
        archive: bool = True,
        first: FirstEntries | None = None,
        carry_inbound_after: int | None = None,
    ) -> str | None:
        """Clear `tape` and its sidecars in one transaction; returns the archive name (see
        TapeStore). Archiving renames tape rows: O(1) in the entries."""

        def rows(archived: str | None) -> list[Row]:
            return [entry_row(e) for e in (first(archived) if first else ())]

        name = archive_name(tape) if archive else None
        return await self._reset(Reset(tape, name, rows, carry_inbound_after))

    async def _reset(self, reset: Reset) -> str | None:
        """The store's reset transaction (see `Reset`)."""
        raise NotImplementedError

    async def _select(self, spec: QuerySpec) -> list[TapeEntry]:
        raise NotImplementedError

    async def append(self, tape: str, entry: TapeEntry) -> TapeEntry:
        """Append one entry; returns it with its id and date."""
        written = await self.append_many(tape, [entry])
        assert written is not None
        return written[0]

    async def archive(self, tape: str) -> str:
        """Move `tape` and its sidecars under an archive name; the live tape starts empty."""
        archived = await self.reset(tape, archive=True)
        if archived is None:
            raise TapeStoreError(f"tape {tape!r} was never written: nothing to archive")
        return archived

    async def get(self, tape: str, entry_id: int) -> TapeEntry | None:
        """One entry by id."""
        found = await self.query(tape, after_id=entry_id - 1, limit=1)
        return found[0] if found and found[0].id == entry_id else None

    async def query(self, tape: str, **filters: Any) -> list[TapeEntry]:
        """Entries of `tape` matching every filter given, oldest first unless `newest_first`
        (filters: see `QuerySpec`)."""
        return await self._select(QuerySpec.build(tape, **filters))

    async def read_context(self, tape: str) -> list[TapeEntry]:
        """The default view: entries strictly after the last anchor (index lookups only)."""
        return await self._select(QuerySpec(tape, after_last_anchor=True))

    async def query_many(self, tape: str, views: Sequence[View]) -> list[list[TapeEntry]]:
        """Several queries of `tape` in order, as one round of work where the store can
        (see TapeStore); here: one after the other."""
        results: list[list[TapeEntry]] = []
        for view in views:
            filters = view(results) if callable(view) else view
            found = [] if filters is None else await self.query(tape, **filters)
            results.append(found)
        return results
