"""`ForkTape`: a `Tape` that reads its parent up to the fork point plus its own entries, and
writes only to itself (the stored side: tape/forks.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .entries import TapeEntry
from .forks import ForkError, ForkPoint, Merged
from .names import sidecar_name
from .query import AnchorNotFound
from .store import TapeStore
from .tape import Tape


async def fork(tape: Tape, *, tag: str = "") -> ForkTape:
    """Fork `tape` (and its sidecars) at its last entry; durable until merged or discarded."""
    point = await tape.store.fork(tape.name, tag=tag, session_id=tape.session_id)
    return ForkTape(tape.store, point)


async def open_fork(store: TapeStore, name: str) -> ForkTape:
    """The live fork `name` (a resumed run's); ForkError when there is none."""
    point = await store.fork_point(name)
    if point is None:
        raise ForkError(f"{name!r} is not a fork (merged or discarded already?)")
    return ForkTape(store, point)


class ForkTape(Tape):
    """A fork: reads `parent` up to `base` plus its own entries (ids go on from `base + 1`)."""

    def __init__(self, store: TapeStore, point: ForkPoint) -> None:
        super().__init__(store, point.name, point.session_id)
        self.point = point
        self.parent = point.parent
        self.base = point.base

    def sidecar(self, name: str) -> Tape:
        """The fork of the parent's sidecar `name` (a plain tape when the parent had none)."""
        own = sidecar_name(self.name, name)
        base = self.point.sidecars.get(name)
        if base is None:
            return Tape(self.store, own, self.session_id)
        return ForkTape(
            self.store, ForkPoint(own, sidecar_name(self.parent, name), base, self.session_id)
        )

    async def append_many(
        self, entries: Sequence[TapeEntry], *, bootstrap: bool = False
    ) -> list[TapeEntry]:
        """Append to the fork only; never a bootstrap anchor (the parent's start is read
        through the fork point, and a new anchor here would hide it)."""
        return await super().append_many(entries)

    async def merge(self) -> Merged:
        """Append this fork's entries (and its sidecars') to the parent; the fork is gone."""
        return await self.store.merge(self.name)

    async def discard(self, *, archive: bool = False) -> str | None:
        """Drop this fork (or archive it: returns the archive name)."""
        return await self.store.discard(self.name, archive=archive)

    async def query(self, **filters: Any) -> list[TapeEntry]:
        """`TapeStore.query` over the parent up to the fork point, then the fork's own."""
        limit = filters.get("limit")
        newest_first = bool(filters.get("newest_first"))
        start = filters.get("after_anchor") or (filters.get("between") or (None,))[0]
        own_filters = dict(filters)
        if start is not None:
            try:
                return await self.store.query(self.name, **filters)
            except AnchorNotFound:
                if not self.base:
                    raise
            own_filters.pop("after_anchor", None)
            own_filters.pop("between", None)
            parent_filters = dict(filters)
        elif filters.get("after_last_anchor"):
            if (await self.store.stats(self.name)).last_anchor_id > self.base:
                return await self.store.query(self.name, **filters)
            own_filters.pop("after_last_anchor")
            parent_filters = dict(own_filters)
            anchors = await self._parent(kinds=["anchor"], limit=1, newest_first=True)
            if anchors:
                parent_filters["after_id"] = max(filters.get("after_id") or 0, anchors[0].id)
        else:
            parent_filters = dict(filters)
        parts: list[list[TapeEntry]] = []
        if self.base and (filters.get("after_id") or 0) < self.base:
            parts.append(await self._parent(**parent_filters))
        parts.append(await self.store.query(self.name, **own_filters))
        if newest_first:
            parts.reverse()
        found = [e for part in parts for e in part]
        return found[:limit] if limit is not None else found

    async def _parent(self, **filters: Any) -> list[TapeEntry]:
        before = filters.get("before_id")
        filters["before_id"] = self.base + 1 if before is None else min(before, self.base + 1)
        return await self.store.query(self.parent, **filters)

    async def anchors(self, limit: int = 20) -> list[TapeEntry]:
        """The newest anchors, oldest first (the parent's before the fork point too)."""
        found = await self.query(kinds=["anchor"], limit=limit, newest_first=True)
        return found[::-1]
