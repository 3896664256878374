"""A turn's writes to its tape: its start (at once, or with its first write), each step's
entries, and its last entries (the answer, or a notice saying why there is none), and the
`TurnResult` that tells the caller how the turn ended. The turn loop (bub_bot/agent/loop.py)
decides what to write; this module only knows how and in which transaction."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..tape import Counting, Tape, TapeEntry
from .model import ModelReply

Notify = Callable[[str, dict[str, Any]], None]


@dataclass
class TurnResult:
    """How a turn ended and what to tell the user.

    `status`: ok | error | max_steps | overflow | approval (the step's calls wait for a
    person: the reply entry is the `approval.request`). `reply_entry` is the tape entry whose text
    is the reply (the final assistant message, or a `turn.notice` event), so delivery can be
    resumed after a crash. `seen_through` is the newest entry id the model saw.
    """

    status: str
    reply: str
    reply_entry: int | None
    seen_through: int
    steps: int = 0
    auto_handoff: bool = False
    usage: dict[str, int] = field(default_factory=dict)
    entry: TapeEntry | None = None
    """The reply entry itself (saves the runtime a read)."""


class TurnWrites:
    """One turn's appends to `tape`. `bootstrapped`: the tape has its anchor already (the
    runtime's ingress writes it with the first message), so no write looks for one."""

    def __init__(self, tape: Tape, bootstrapped: bool = False) -> None:
        self.tape = tape
        self.bootstrap = not bootstrapped
        self.opening: list[TapeEntry] = []
        """The turn's start while it is not written: it goes first in the turn's first
        write, with the bootstrap anchor if the tape has none."""

    async def begin(
        self,
        new_messages: Sequence[dict[str, Any]],
        turn_id: str,
        payer: dict[str, Any] | None,
        streams: bool,
        turn_start: int | None,
    ) -> int:
        """Record the turn's start (`new_messages`, then `loop.start`); returns the entry id
        after which the turn's user messages begin (`turn_start`, when the caller knows it)."""
        first = [TapeEntry.message(m) for m in new_messages]
        start: dict[str, Any] = {"turn": turn_id}
        if payer is not None:
            start["payer"] = payer
        if streams:
            # The runtime's mark that partial text may show (runtime/streaming.py).
            start["streams"] = True
        first.append(TapeEntry.event("loop.start", start, context=False))
        if new_messages or streams:
            # A streamed turn's start is the mark that partial text may show: it must be on
            # the tape before the first partial (runtime/streaming.py, `await_partial`).
            # The bootstrap anchor (if the tape has none) goes first, in the same transaction.
            written = await self.tape.append_many(first, bootstrap=self.bootstrap)
            return written[0].id - 1 if turn_start is None else turn_start
        # Nothing to put on the tape before the first model call: fewer trips to the store.
        self.opening = first
        return await last_id(self.tape) if turn_start is None else turn_start

    async def write(
        self, entries: list[TapeEntry], usage: Counting | None = None
    ) -> list[TapeEntry]:
        """Append a step's entries after whatever of the turn's start is not written."""
        head, self.opening = self.opening, []
        written = await self.tape.append_many(
            [*head, *entries], bootstrap=self.bootstrap and bool(head), usage=usage
        )
        return written[len(head) :]

    async def flush(self) -> None:
        """Write the turn's start before records written by others (tools, handoffs)."""
        if self.opening:
            await self.write([])

    async def answer(
        self,
        reply: ModelReply,
        run_event: TapeEntry,
        counting: Counting | None,
        *,
        turn_id: str,
        step: int,
        seen_through: int,
        step_started: float,
    ) -> TapeEntry:
        """Write the model's answer that ends the turn (with its `run` and `loop.step`
        records); returns the answer's entry."""
        final = TapeEntry.message(
            {"role": "assistant", "content": reply.content},
            turn=turn_id,
            seen_through=seen_through,
        )
        written = await self.write(
            [final, run_event, step_event(step, "ok", step_started)], counting
        )
        return written[0]

    async def notice(
        self,
        notify: Notify,
        status: str,
        message: str,
        step: int,
        seen_through: int,
        usage: dict[str, int],
        *,
        error: tuple[str, str] | None = None,
        auto_handoff: bool = False,
    ) -> TurnResult:
        """End a turn without a model answer: record why and the note the user gets."""
        entries = []
        if error is not None:
            entries.append(TapeEntry.error(*error))
        entries.append(
            TapeEntry.event(
                "turn.notice",
                {"status": status, "text": message, "seen_through": seen_through},
                context=False,
            )
        )
        written = await self.write(entries, None)
        notify("turn", {"status": status})
        return TurnResult(
            status, message, written[-1].id, seen_through, step, auto_handoff, usage, written[-1]
        )


def run_record(
    reply: ModelReply, step: int, turn_id: str, payer: dict[str, Any] | None
) -> TapeEntry:
    """The `run` event of a model call: its model, usage and latency (and whom it is for)."""
    run_data: dict[str, Any] = {
        "model": reply.model,
        "usage": reply.usage,
        "latency_ms": round(reply.latency_ms, 1),
        "step": step,
        "turn": turn_id,
    }
    if payer is not None:
        run_data["payer"] = payer
    return TapeEntry.event("run", run_data, context=False)


def step_event(step: int, status: str, started: float) -> TapeEntry:
    """The `loop.step` record of a step that ended with `status`."""
    return TapeEntry.event(
        "loop.step",
        {"step": step, "status": status, "elapsed_ms": ms_since(started)},
        context=False,
    )


async def last_id(tape: Tape) -> int:
    """The tape's newest entry id (0: empty)."""
    newest = await tape.query(limit=1, newest_first=True)
    return newest[0].id or 0 if newest else 0


def ms_since(started: float) -> float:
    """Milliseconds since `started` (a `time.perf_counter()` reading), to 0.1 ms."""
    return round((time.perf_counter() - started) * 1000, 1)
