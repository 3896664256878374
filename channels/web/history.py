"""A web conversation as the page shows it, read from its tape.

The page shows what was said: the user's messages and commands, the answers and notices
the runtime delivered, and anchors as dividers. A `Cursor` (the newest entry id the page
has read, with that entry's date) lets a reconnecting page continue exactly where it
stopped; when the entry under the cursor is gone or has another date, `/reset` cleared the
tape (ids restart at 1) and the page gets a fresh snapshot. Entries are never edited, so one
read checks both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape
from typing import Any

from bub_bot.tape import BOOTSTRAP_ANCHOR, TapeEntry

from .render import markdown, plain

HISTORY_LIMIT = 200
"""Items shown after a (re)load; older ones are in the tape viewer."""
TAIL_BATCH = 500
TAIL_LIMIT = 5000
"""More new entries than this at once: send a fresh snapshot instead."""

# `name` of the entries the page shows: message roles, event names.
CHAT_NAMES = (
    "user",
    "assistant",
    "command",
    "command.done",
    "command.result",
    "turn.notice",
    "inbound.expired",
    "schedule.notice",
    "approval.request",
    "approval.closed",
    "file.sent",
)


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page is on a tape: the newest entry id it has read and that entry's date
    (as digits)."""

    stamp: str
    id: int

    def __str__(self) -> str:
        return f"{self.stamp}-{self.id}"

    @classmethod
    def at(cls, entry: TapeEntry | None) -> Cursor:
        return cls(stamp_of(entry), entry.id) if entry is not None else cls("", 0)

    @classmethod
    def parse(cls, value: str | None) -> Cursor | None:
        if not value:
            return None
        match = re.fullmatch(r"(\d{0,24})-(\d{1,12})", value.strip())
        return cls(match.group(1), int(match.group(2))) if match else None


def stamp_of(entry: TapeEntry | None) -> str:
    """An entry's date as digits (for the cursor)."""
    return re.sub(r"\D", "", entry.date)[:24] if entry is not None else ""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif part.get("type") == "image_url":
                parts.append("[image]")
        return "\n".join(parts)
    return ""


def _anchor_html(entry: TapeEntry) -> str:
    name = str(entry.payload.get("name", ""))
    state = entry.payload.get("state") or {}
    if name == BOOTSTRAP_ANCHOR:
        label = "Conversation started"
        if state.get("archived"):
            label = "Started afresh (/reset): the earlier conversation is archived"
    elif name.startswith("auto_handoff/"):
        label = "The conversation outgrew the model's context: a new phase starts here"
    else:
        label = "Handoff" if name == "handoff" else f"Handoff: {name}"
    html = f'<div class="anchor-name">{escape(label)}</div>'
    summary = state.get("summary")
    if isinstance(summary, str) and summary.strip():
        html += f'<div class="summary">{markdown(summary)}</div>'
    return html


def chat_item(entry: TapeEntry) -> dict[str, Any] | None:
    """The page's view of one entry, or None for entries the chat does not show."""
    base: dict[str, Any] = {"id": entry.id, "date": entry.date}
    meta = entry.meta
    if entry.kind == "message":
        role = entry.payload.get("role")
        content = _text(entry.payload.get("content"))
        if role == "user" and meta.get("inbound") and not meta.get("copy_of"):
            return {
                **base,
                "kind": "user",
                "html": plain(content),
                "client_id": meta.get("message_id"),
            }
        if role == "assistant" and "turn" in meta:
            # `answer`: a turn's final answer, which replaces the partial one on the page.
            return {**base, "kind": "bot", "html": markdown(content), "answer": True}
        return None
    if entry.kind == "event":
        name = entry.payload.get("name")
        data = entry.payload.get("data") or {}
        text = str(data.get("text", ""))
        if name == "command" and meta.get("inbound"):
            return {
                **base,
                "kind": "user",
                "html": plain(text),
                "client_id": meta.get("message_id"),
            }
        if name in ("command.done", "command.result"):
            return {**base, "kind": "bot", "html": plain(text)}
        if name == "file.sent" and data.get("ids"):
            # A file the bot sent (send_file): a download link behind the page's token.
            file_id = str(data["ids"][0])
            label = escape(f"📎 {data.get('name', 'file')}")
            html = f'<a href="/api/files/{escape(file_id)}" download>{label}</a>'
            return {**base, "kind": "bot", "html": html}
        if name in ("turn.notice", "inbound.expired", "schedule.notice"):
            return {**base, "kind": "notice", "html": plain(text)}
        if name == "approval.request":
            # The page shows Approve / Deny buttons bound to the request and its digest.
            shown = text.rsplit("\nReply /approve", 1)[0]
            bound = {"id": str(data.get("id", "")), "digest": str(data.get("digest", ""))}
            return {**base, "kind": "approval", "html": plain(shown), "approval": bound}
        if name == "approval.closed":
            closed = str(data.get("request", ""))
            return {**base, "kind": "notice", "html": plain(text), "approval_closed": closed}
        return None
    if entry.kind == "anchor":
        return {**base, "kind": "anchor", "html": _anchor_html(entry)}
    return None


def _items(entries: list[TapeEntry]) -> list[dict[str, Any]]:
    return [item for item in map(chat_item, entries) if item is not None]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a page shows after a (re)load: since the last anchor, at most HISTORY_LIMIT."""

    cursor: Cursor
    items: list[dict[str, Any]]
    truncated: bool


async def snapshot(store: Any, tape: str) -> Snapshot:
    """The conversation since its last anchor (the anchor itself first, as a divider)."""
    stats = await store.stats(tape)
    if not stats.entries:
        return Snapshot(Cursor("", 0), [], False)
    anchor_id = stats.last_anchor_id
    found = await store.query(
        tape, after_id=anchor_id, names=CHAT_NAMES, newest_first=True, limit=HISTORY_LIMIT + 1
    )
    truncated = len(found) > HISTORY_LIMIT
    found = found[:HISTORY_LIMIT][::-1]
    entries = []
    if anchor_id and not truncated:
        anchor = await store.get(tape, anchor_id)
        if anchor is not None:
            entries.append(anchor)
    entries.extend(found)
    newest = await store.query(tape, newest_first=True, limit=1)
    return Snapshot(Cursor.at(newest[0] if newest else None), _items(entries), truncated)


async def tail(
    store: Any, tape: str, cursor: Cursor
) -> tuple[Cursor, list[dict[str, Any]], Snapshot | None]:
    """What was written after `cursor`: (new cursor, items, None), or a fresh snapshot when
    the tape was reset since (or too much happened to send entry by entry).

    One read in the usual case: the entry under the cursor (to see the tape is the same)
    and everything after it."""
    after = max(0, cursor.id - 1)
    new: list[TapeEntry] = []
    while True:
        batch = await store.query(tape, after_id=after, limit=TAIL_BATCH)
        full = len(batch) == TAIL_BATCH
        if after < cursor.id:
            head = batch[0] if batch else None
            if head is None or head.id != cursor.id or stamp_of(head) != cursor.stamp:
                fresh = await snapshot(store, tape)  # reset: the ids started again
                return fresh.cursor, fresh.items, fresh
            batch = batch[1:]
        new.extend(batch)
        if not full:
            break
        after = new[-1].id if new else cursor.id
        if len(new) >= TAIL_LIMIT:
            fresh = await snapshot(store, tape)
            return fresh.cursor, fresh.items, fresh
    if not new:
        return cursor, [], None
    return Cursor.at(new[-1]), _items(new), None
