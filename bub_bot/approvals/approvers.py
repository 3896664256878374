"""Who may approve a request: `BUB_APPROVERS`.

Comma-separated entries: `requester` (the person whose message started the turn: the
default), `*` (anyone in the conversation), or `<channel>:<user id>` (`slack:U0123`,
`telegram:42`), also `<channel>:*` / `<channel>:requester` for one channel only. An entry
without a channel applies to every channel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError

REQUESTER = "requester"
ANYONE = "*"


@dataclass(frozen=True)
class Approvers:
    """Parsed `BUB_APPROVERS`: per channel (`""`: every channel) the allowed entries."""

    entries: dict[str, frozenset[str]] = field(default_factory=lambda: {"": frozenset({REQUESTER})})

    @classmethod
    def parse(cls, value: str) -> Approvers:
        entries: dict[str, set[str]] = {}
        for part in (p.strip() for p in (value or "").split(",")):
            if not part:
                continue
            channel, sep, who = part.rpartition(":") if ":" in part else ("", "", part)
            if sep and (not channel or not who):
                raise ConfigError(f"BUB_APPROVERS: {part!r} is not <channel>:<user id>")
            entries.setdefault(channel, set()).add(who)
        if not entries:
            return cls()
        return cls({k: frozenset(v) for k, v in entries.items()})

    def allowed(self, channel: str, user_id: str, requester_id: str) -> bool:
        """Whether `user_id` (on `channel`) may decide a request `requester_id`'s turn made."""
        found = self.entries.get(channel, frozenset()) | self.entries.get("", frozenset())
        if ANYONE in found or user_id in found:
            return True
        return REQUESTER in found and bool(user_id) and user_id == requester_id

    def describe(self, channel: str) -> str:
        """Who may decide, in words (for the request message)."""
        found = self.entries.get(channel, frozenset()) | self.entries.get("", frozenset())
        if ANYONE in found:
            return "anyone here"
        names = sorted(found - {REQUESTER})
        who = (["the person who asked"] if REQUESTER in found else []) + names
        return " or ".join(who) or "nobody"
