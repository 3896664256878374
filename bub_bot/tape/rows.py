"""Entries as the rows a store keeps (checked and encoded once, before any write) and the
write plans both stores run as one transaction each (`Append`, `Reset`, `Copies`)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .entries import PayloadError, TapeEntry, dumps, safe_text
from .jobs import Firing, Job
from .names import FORK_SEP
from .store import TapeStoreError
from .usage import UsageAdd

log = logging.getLogger("bub_bot.tape")

Row = tuple[str, str | None, str, str, str]


@dataclass(frozen=True, slots=True)
class Append:
    """One append transaction as a store runs it: the rows, checked and encoded; the dedupe
    keys, sorted (two transactions recording the same keys take them in the same order).
    The store returns the rows' ids, or None when it refused: a dedupe key was recorded
    already, or `if_no_anchor` and the tape has an anchor."""

    tape: str
    rows: list[Row]
    dedupe_keys: list[str]
    if_no_anchor: bool
    bootstrap: Row | None
    session_id: str | None
    adds: list[UsageAdd] = field(default_factory=list)
    """Counters added in the same transaction, each (key, window) once, sorted."""
    decide: Callable[[dict[tuple[str, str], int]], list[Row] | None] | None = None
    """Given the counters' `messages` after the adds, rows to write instead (None: `rows`)."""


@dataclass(frozen=True, slots=True)
class Reset:
    """One reset transaction: `rows(archive name or None)` starts the fresh tape; the store
    archives under `archived` (None: deletes) and returns the archive name, None when the
    tape was never written."""

    tape: str
    archived: str | None
    rows: Callable[[str | None], list[Row]]
    carry_inbound_after: int | None


@dataclass(frozen=True, slots=True)
class Copies:
    """One copy transaction: `rows` (of `entries`) keep their ids and dates."""

    tape: str
    entries: list[TapeEntry]
    rows: list[Row]
    session_id: str | None
    updated: str


def entry_row(e: TapeEntry) -> Row:
    """An entry as a stored row (kind, name, payload, meta, date); fails before any write."""
    name = e.name
    return (
        e.kind,
        safe_text(name) if isinstance(name, str) else None,
        dumps(e.payload, "payload"),
        dumps(e.meta, "meta"),
        e.date,
    )


def row_entry(id_: int, kind: str, payload: str, meta: str, date_: str) -> TapeEntry:
    """A stored row back as an entry."""
    return TapeEntry(kind, json.loads(payload), json.loads(meta), date_, id_)


def is_inbound(meta: str) -> bool:
    """Whether stored meta marks an inbound message as it arrived (carried over a reset); a
    copy made after an anchor was answered already (older tapes marked copies inbound too)."""
    # Stored meta is compact JSON, so the key reads `"inbound":`; cheap test first.
    if '"inbound":' not in meta:
        return False
    parsed = json.loads(meta)
    value = parsed.get("inbound")
    return (value is True or value == 1) and "copy_of" not in parsed


def firing_append(job: Job, firing: Firing) -> Append | None:
    """The append a firing writes on its job's tape (None: it writes nothing, or its entry
    cannot be stored: the job moves on without it rather than block every later one)."""
    if firing.entry is None:
        return None
    try:
        return Append(
            job.tape,
            [entry_row(firing.entry)],
            sorted({safe_text(k) for k in firing.keys}),
            False,
            entry_row(firing.bootstrap) if firing.bootstrap else None,
            safe_text(job.session_id),
        )
    except PayloadError as exc:
        log.error("job.unstorable job=%s session=%s: %s", job.id, job.session_id, exc)
        return None


def new_tag() -> str:
    """A fresh fork tag."""
    return uuid.uuid4().hex[:12]


def with_ids(entries: Sequence[TapeEntry], ids: Sequence[int]) -> list[TapeEntry]:
    """`entries` as written, carrying the ids the store gave them."""
    return [
        TapeEntry(e.kind, e.payload, e.meta, e.date, i) for e, i in zip(entries, ids, strict=True)
    ]


def fork_base(tape: str, entries: Sequence[TapeEntry]) -> int:
    """Where a copied fork's (or archived fork's) own entries start from: its fork point
    (0: `tape` is no fork, or the copy does not start it)."""
    if FORK_SEP not in tape or not entries or entries[0].id is None:
        return 0
    return max(entries[0].id - 1, 0)


def check_copy_ids(tape: str, entries: Sequence[TapeEntry], last_id: int) -> None:
    """Copied entries must continue `tape` densely after `last_id`."""
    expected = list(range(last_id + 1, last_id + 1 + len(entries)))
    if [e.id for e in entries] != expected:
        got = [e.id for e in entries[:3]]
        raise TapeStoreError(
            f"tape {tape}: copied entries must continue at id {last_id + 1} without gaps"
            f" (got {got}…)"
        )
