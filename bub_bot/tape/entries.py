"""Tape entries: the immutable facts a tape is made of."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

KINDS = ("message", "tool_call", "tool_result", "anchor", "event", "system", "error")


def utc_now() -> str:
    """The current time as ISO-8601 UTC, the format every entry date uses."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


class PayloadError(ValueError):
    """An entry whose payload or meta cannot be stored as JSON."""


@dataclass(frozen=True, slots=True)
class TapeEntry:
    """One immutable record on a tape.

    `id` is 0 until the store assigns the entry its dense, 1-based position on the tape.
    """

    kind: str
    payload: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    date: str = field(default_factory=utc_now)
    id: int = 0

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def message(cls, msg: dict[str, Any], **meta: Any) -> TapeEntry:
        """A chat message (an OpenAI message dict with `role` and `content`)."""
        if not isinstance(msg, dict) or "role" not in msg:
            raise PayloadError("a message entry needs a dict with a 'role'")
        return cls("message", dict(msg), meta)

    @classmethod
    def tool_call(cls, calls: list[dict[str, Any]], **meta: Any) -> TapeEntry:
        """The model's tool calls: `[{id, type: "function", function: {name, arguments}}]`."""
        for call in calls:
            if not call.get("id"):
                raise PayloadError("every tool call needs an 'id'")
        return cls("tool_call", {"calls": [dict(c) for c in calls]}, meta)

    @classmethod
    def tool_result(cls, results: list[dict[str, Any]], **meta: Any) -> TapeEntry:
        """Tool results, each `{"tool_call_id": ..., "content": ...}` naming the call it answers."""
        for result in results:
            if not isinstance(result, dict) or not result.get("tool_call_id"):
                raise PayloadError("every tool result needs the 'tool_call_id' it answers")
        return cls("tool_result", {"results": [dict(r) for r in results]}, meta)

    @classmethod
    def anchor(cls, name: str, state: dict[str, Any] | None = None, **meta: Any) -> TapeEntry:
        """A rebuild point: the default context starts after the last one."""
        if not name:
            raise PayloadError("an anchor needs a name")
        return cls("anchor", {"name": name, "state": dict(state or {})}, meta)

    @classmethod
    def event(cls, name: str, data: dict[str, Any] | None = None, **meta: Any) -> TapeEntry:
        """An operational record (loop steps, runs, commands, deliveries); never model input."""
        if not name:
            raise PayloadError("an event needs a name")
        return cls("event", {"name": name, "data": dict(data or {})}, meta)

    @classmethod
    def system(cls, text: str) -> TapeEntry:
        """An audit note; never sent to the model."""
        return cls("system", {"content": text})

    @classmethod
    def error(cls, kind: str, message: str) -> TapeEntry:
        """A recorded failure; never sent to the model."""
        return cls("error", {"kind": kind, "message": message})

    # -- helpers ------------------------------------------------------------------------------
    @property
    def name(self) -> str | None:
        """The anchor or event name, or the role of a message; used for indexed lookups."""
        if self.kind in ("anchor", "event"):
            return self.payload.get("name")
        if self.kind == "message":
            return self.payload.get("role")
        return None

    def copy_after_anchor(self) -> TapeEntry:
        """This message written again after a new anchor (auto-handoff, a /handoff that
        overtook it): same payload and meta, `copy_of` pointing back; the delivery key stays
        with the original so the copy is never taken for a new inbound message."""
        # Neither the delivery key nor the inbound flag: a copy is never a new inbound
        # message, and a /reset never carries it into the fresh conversation.
        meta = {k: v for k, v in self.meta.items() if k not in ("delivery_key", "inbound")}
        meta["copy_of"] = self.id
        return TapeEntry(self.kind, self.payload, meta)

    def to_json(self) -> dict[str, Any]:
        """The entry as a plain dict (the JSONL export format)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "payload": self.payload,
            "meta": self.meta,
            "date": self.date,
        }


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def dumps(value: Any, what: str) -> str:
    """Serialise a payload or meta dict, failing with a clear error when it is not JSON."""
    if not value:
        return "{}" if isinstance(value, dict) else _encode(value)
    try:
        text = _encode(value)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"entry {what} is not JSON-serialisable: {exc}") from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (undecodable file names, broken JSON escapes) cannot be stored as
        # UTF-8; ASCII escapes keep them exactly and still round-trip through json.loads.
        text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text


def safe_text(value: str) -> str:
    """`value` as text every database stores: NUL and lone surrogates escaped, the same way
    every time (so a key written this way is found again)."""
    if "\x00" in value:
        value = value.replace("\x00", "\\x00")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value
