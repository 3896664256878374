"""Who pays for a model call: the person (`<channel>:<user id>`) and the conversation (the
session id) the work is for. A chat turn's payer is its newest message's sender; a scheduled
turn's is the job's creator (the job's message carries them as `sender`); `/handoff` summaries
are the command's sender's. Work that runs for someone else later (subagents, approvals) puts
`meta.payer = {"user": ..., "conversation": ...}` on the entry that starts it: it wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Payer:
    """The counters a model call adds to (besides the total and the model's)."""

    conversation: str
    user: str = ""
    """`<channel>:<user id>`; "" when nobody is known (then only the conversation pays)."""
    channel: str = ""

    @classmethod
    def of(cls, session_id: str, meta: dict[str, Any]) -> Payer:
        """The payer of work started by an entry with `meta` in session `session_id`."""
        channel = str(meta.get("channel") or "")
        given = meta.get("payer")
        if isinstance(given, dict):
            return cls(
                str(given.get("conversation") or session_id),
                str(given.get("user") or ""),
                str(given.get("channel") or channel),
            )
        sender = meta.get("sender") or {}
        user_id = sender.get("id") if isinstance(sender, dict) else None
        user = f"{channel}:{user_id}" if channel and user_id not in (None, "") else ""
        return cls(session_id, user, channel)

    def to_json(self) -> dict[str, str]:
        """For `meta.payer` of an entry that starts work for this payer later."""
        return {"conversation": self.conversation, "user": self.user, "channel": self.channel}
