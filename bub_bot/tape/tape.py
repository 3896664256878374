"""`Tape`: one session's record, with the operations the agent and commands use; `ForkTape`:
a durable fork of one (tape/forks.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .context import Selector, default_selector, visible
from .entries import TapeEntry
from .forks import ForkPoint, Merged
from .names import sidecar_name, tape_name
from .query import AnchorNotFound
from .store import TapeStore
from .usage import Counting
from .views import View

BOOTSTRAP_ANCHOR = "session/start"


@dataclass(frozen=True, slots=True)
class TapeInfo:
    """What `/status` and `tape.info` report."""

    name: str
    entries: int
    anchors: int
    last_anchor: str | None
    entries_since_anchor: int
    last_usage: dict[str, Any] | None


class Tape:
    """A named tape in a store. Cheap to create; holds no entries in memory."""

    def __init__(self, store: TapeStore, name: str, session_id: str | None = None) -> None:
        self.store = store
        self.name = name
        self.session_id = session_id

    @classmethod
    def for_session(cls, store: TapeStore, session_id: str, workspace: str | Path) -> Tape:
        """The tape of `session_id` in `workspace`."""
        return cls(store, tape_name(session_id, workspace), session_id)

    def sidecar(self, name: str) -> Tape:
        """The sibling tape `name` (e.g. "spill") that follows this tape through resets."""
        return Tape(self.store, sidecar_name(self.name, name), self.session_id)

    # -- appends ------------------------------------------------------------------------------
    async def append(self, entry: TapeEntry) -> TapeEntry:
        """Append one entry."""
        written = await self.append_many([entry])
        return written[0]

    async def append_many(
        self,
        entries: Sequence[TapeEntry],
        *,
        bootstrap: bool = False,
        usage: Counting | None = None,
    ) -> list[TapeEntry]:
        """Append entries in one transaction (after `session/start` if `bootstrap` and the
        tape has no anchor yet), adding `usage` to its counters in the same transaction."""
        written = await self.store.append_many(
            self.name,
            entries,
            session_id=self.session_id,
            bootstrap=self.bootstrap_anchor() if bootstrap else None,
            usage=usage,
        )
        assert written is not None
        return written

    async def append_message(self, msg: dict[str, Any], **meta: Any) -> TapeEntry:
        """Append a chat message."""
        return await self.append(TapeEntry.message(msg, **meta))

    async def append_event(
        self, name: str, data: dict[str, Any] | None = None, **meta: Any
    ) -> TapeEntry:
        """Append an event."""
        return await self.append(TapeEntry.event(name, data, **meta))

    async def append_error(self, kind: str, message: str) -> TapeEntry:
        """Append an error record."""
        return await self.append(TapeEntry.error(kind, message))

    # -- phases -------------------------------------------------------------------------------
    async def handoff(
        self,
        name: str,
        state: dict[str, Any] | None = None,
        *,
        then: Sequence[TapeEntry] = (),
    ) -> TapeEntry:
        """Start a new phase: the anchor plus a `handoff` event (and `then`), one transaction."""
        entries = [
            TapeEntry.anchor(name, state),
            TapeEntry.event("handoff", {"name": name, "state": state or {}}),
            *then,
        ]
        written = await self.append_many(entries)
        return written[0]

    @staticmethod
    def bootstrap_anchor(workspace: str | Path | None = None) -> TapeEntry:
        """The `session/start` anchor every tape begins with; it records the session's
        workspace so a resume (or another replica) works in the same one."""
        return TapeEntry.anchor(BOOTSTRAP_ANCHOR, _start_state(workspace))

    async def ensure_bootstrap_anchor(self) -> TapeEntry | None:
        """Write `session/start` if the tape has no anchor yet; returns it when written."""
        written = await self.store.append_many(
            self.name,
            [self.bootstrap_anchor()],
            if_no_anchor=True,
            session_id=self.session_id,
        )
        return written[0] if written else None

    async def reset(
        self,
        archive: bool = True,
        *,
        carry: Sequence[TapeEntry] = (),
        carry_inbound_after: int | None = None,
        then: Callable[[str | None], TapeEntry] | None = None,
        workspace: str | Path | None = None,
    ) -> str | None:
        """Archive (by default) and clear the tape and its sidecars, then write `session/start`.

        One transaction. `carry` entries are re-written after the new anchor; with
        `carry_inbound_after`, inbound messages after that id follow them (messages queued
        behind a /reset must not vanish into the archive). `then(archive_name)` makes an entry
        written right after the new anchor in the same transaction (the /reset reply).
        """

        def first(archived: str | None) -> list[TapeEntry]:
            state = _start_state(workspace)
            if archived:
                state["archived"] = archived
            carried = [TapeEntry(e.kind, e.payload, e.meta, e.date) for e in carry]
            made = [then(archived)] if then is not None else []
            return [TapeEntry.anchor(BOOTSTRAP_ANCHOR, state), *made, *carried]

        return await self.store.reset(
            self.name, archive=archive, first=first, carry_inbound_after=carry_inbound_after
        )

    async def fork(self, *, tag: str = "") -> ForkTape:
        """A durable fork of this tape (and its sidecars) at its last entry: it reads this
        tape up to here plus its own entries and writes only to itself, until `merge()` or
        `discard()` (tape/forks.py)."""
        point = await self.store.fork(self.name, tag=tag, session_id=self.session_id)
        return ForkTape(self.store, point)

    # -- reads --------------------------------------------------------------------------------
    async def query(self, **filters: Any) -> list[TapeEntry]:
        """`TapeStore.query` on this tape."""
        return await self.store.query(self.name, **filters)

    async def query_many(self, *views: View) -> list[list[TapeEntry]]:
        """`TapeStore.query_many` on this tape: several queries as one round of work."""
        return await self.store.query_many(self.name, views)

    async def anchors(self, limit: int = 20) -> list[TapeEntry]:
        """The newest anchors, oldest first."""
        found = await self.query(kinds=["anchor"], limit=limit, newest_first=True)
        return found[::-1]

    async def info(self) -> TapeInfo:
        """Counts from index lookups (newest id, anchors, newest `run` event); never a scan."""
        stats = await self.store.stats(self.name)
        last_anchor = None
        if stats.last_anchor_id:
            anchor = await self.store.get(self.name, stats.last_anchor_id)
            last_anchor = anchor.payload.get("name") if anchor else None
        runs = await self.query(kinds=["event"], names=["run"], limit=1, newest_first=True)
        usage = runs[0].payload.get("data", {}).get("usage") if runs else None
        return TapeInfo(
            name=self.name,
            entries=stats.entries,
            anchors=stats.anchors,
            last_anchor=last_anchor,
            entries_since_anchor=stats.entries - stats.last_anchor_id,
            last_usage=usage,
        )

    async def read_entries(self, **view: Any) -> list[TapeEntry]:
        """The entries of a view (default: after the last anchor), `context=False` removed."""
        if not view:
            view = {"after_last_anchor": True}
        return visible(await self.query(**view))

    async def read_messages(
        self, selector: Selector = default_selector, **view: Any
    ) -> list[dict[str, Any]]:
        """The model messages for a view (default: after the last anchor)."""
        return selector(await self.read_entries(**view))


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
        self,
        entries: Sequence[TapeEntry],
        *,
        bootstrap: bool = False,
        usage: Counting | None = None,
    ) -> list[TapeEntry]:
        """Append to the fork only; never a bootstrap anchor (the parent's start is read
        through the fork point, and a new anchor here would hide it). `usage` is counted
        now: a model call was paid for whether or not the fork is merged."""
        return await super().append_many(entries, usage=usage)

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

    async def query_many(self, *views: View) -> list[list[TapeEntry]]:
        """The queries one after the other (each reads the parent and the fork)."""
        results: list[list[TapeEntry]] = []
        for view in views:
            filters = view(results) if callable(view) else view
            results.append([] if filters is None else await self.query(**filters))
        return results

    async def _parent(self, **filters: Any) -> list[TapeEntry]:
        before = filters.get("before_id")
        filters["before_id"] = self.base + 1 if before is None else min(before, self.base + 1)
        return await self.store.query(self.parent, **filters)

    async def anchors(self, limit: int = 20) -> list[TapeEntry]:
        """The newest anchors, oldest first (the parent's before the fork point too)."""
        found = await self.query(kinds=["anchor"], limit=limit, newest_first=True)
        return found[::-1]


def _start_state(workspace: str | Path | None) -> dict[str, Any]:
    state: dict[str, Any] = {"owner": "human"}
    if workspace is not None:
        state["workspace"] = str(workspace)
    return state
