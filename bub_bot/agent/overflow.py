"""What the loop writes when the model's context overflows: an automatic handoff (a new
anchor with this turn's user messages copied after it, then one retry), and, when even that
overflows, an anchor after the too-long message so the session is not stuck re-sending it."""

from __future__ import annotations

from ..tape import Tape, TapeEntry
from .model import ContextOverflow

AUTO_HANDOFF_ANCHOR = "auto_handoff/context_overflow"
TOO_LONG_ANCHOR = "auto_handoff/message_too_long"


async def turn_user_messages(tape: Tape, turn_start: int) -> list[TapeEntry]:
    """Copies of this turn's user messages, to re-append after a new anchor."""
    found = await tape.query(after_id=turn_start, kinds=["message"], names=["user"])
    copies = []
    for entry in found:
        if entry.meta.get("handoff_summary") or entry.meta.get("copy_of"):
            continue
        copies.append(entry.copy_after_anchor())
    return copies


async def auto_handoff(
    tape: Tape, exc: ContextOverflow, step: int, elapsed_ms: float, turn_start: int
) -> None:
    """The automatic handoff: the anchor, the step's record, this turn's messages after it."""
    await tape.append_many(
        [
            TapeEntry.anchor(
                AUTO_HANDOFF_ANCHOR, {"reason": "context_length_exceeded", "error": str(exc)}
            ),
            TapeEntry.event(
                "loop.step",
                {"step": step, "status": "auto_handoff", "elapsed_ms": elapsed_ms},
                context=False,
            ),
            *await turn_user_messages(tape, turn_start),
        ]
    )


async def past_too_long(tape: Tape, exc: ContextOverflow, seen_through: int) -> None:
    """The message itself is too long: the next turn starts after it. Messages that arrived
    during this call were not seen: they follow the anchor, or the next turn would answer a
    conversation without them."""
    late = await tape.query(after_id=seen_through, kinds=["message"])
    await tape.append_many(
        [
            TapeEntry.anchor(TOO_LONG_ANCHOR, {"reason": "message_too_long", "error": str(exc)}),
            *(e.copy_after_anchor() for e in late if _is_user_inbound(e)),
        ]
    )


def _is_user_inbound(entry: TapeEntry) -> bool:
    """A user's message as it arrived (not a copy made after an anchor)."""
    return (
        bool(entry.meta.get("inbound"))
        and "copy_of" not in entry.meta
        and entry.payload.get("role") == "user"
    )
