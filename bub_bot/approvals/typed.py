"""The reply to a typed `/approve [id]` or `/deny [id]` that decided nothing: the runtime
stores the ones that decide as a press (`bub_bot/runtime/approvals.py`); the rest reach the
command runner, which says why (nothing waits, this person may not decide, already decided)."""

from __future__ import annotations

from ..tape import Tape
from .approvers import Approvers
from .requests import open_requests


async def typed_note(
    tape: Tape, request_id: str, sender_id: str, channel: str, approvers: Approvers
) -> str:
    """Why `/approve`/`/deny` (for `request_id`; "" for the newest) decided nothing."""
    waiting = [r for r in await open_requests(tape) if r.decision is None]
    chosen = [r for r in waiting if request_id in ("", r.id)]
    if not chosen:
        which = f" {request_id}" if request_id else ""
        return f"No approval request{which} is waiting here."
    data = chosen[-1].data
    requester = str((data.get("requester") or {}).get("id", ""))
    if not approvers.allowed(channel, sender_id, requester):
        who = data.get("approvers") or approvers.describe(channel)
        return f"You may not decide this request (who may: {who}). Nothing changed."
    return "That request was decided already (or it expired); nothing runs twice."
