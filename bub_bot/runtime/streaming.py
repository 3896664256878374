"""Streaming a reply while the model writes it: progress from the agent -> throttled updates
of the channel's `ReplyStream`, and what becomes visible recorded on the tape.

The model reports every delta (`Progress`); a `TurnStream` keeps only the newest and one pump
task hands it to the channel at most once per interval per conversation (the first one at
once). Nothing partial is ever recorded as delivered: the final answer is written to the tape
and delivered as before, through the stream (`Delivery.send(stream=...)`), so the partial
message becomes the answer.

Crash safety: the platform ids of every message that shows partial text are recorded
(`stream.shown`, context=False) as soon as the channel reports them. Ids that later hold a
final piece appear in `reply.sent` / `reply.unknown`, ids the final answer did not need in
`stream.closed`. Whatever is left open after a crash is taken over by the next delivery to
the session (`leftover`), which edits it into the answer: never two answers, never one lost.

Database outages: a streamed turn's start (`loop.start`, written by the agent before its
first model call) says `streams`, and `stream.shown` counts as recorded only once it is
written (`records.py` retries it until the database is back). A replica that takes over a
session whose newest streamed turn has no `stream.shown` waits up to a lease period for it
(`await_partial`): its sender, cut from the database, writes it as soon as it can. A sender
that died never does: after the wait the answer comes as a new message (as before). A turn
that had shown nothing yet, or only a draft (no message id), costs such a takeover the same
wait; in exchange the mark costs no write and the first partial waits for no write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from channels.base import Channel, ReplyStream, Streams

from ..agent import Progress
from ..config import Settings
from ..tape import Tape, TapeEntry
from .facts import DONE, REPLY_SENT, REPLY_UNKNOWN, SHOWN
from .records import Records

log = logging.getLogger("bub_bot.runtime")

OPENING = "loop.start"
"""A turn's start (written by the agent before its first model call) says `streams` when the
turn shows partial text: a takeover waits for the `stream.shown` that may follow (the
partial's id) before it answers anew. The mark costs no write of its own."""
CLOSED = "stream.closed"
STREAM_EVENTS = [SHOWN, CLOSED, REPLY_SENT, REPLY_UNKNOWN]
WAIT_POLL = 0.2
"""Seconds between looks at the tape while waiting for another process's `stream.shown`."""
HELD_RETRY = 0.1
"""Seconds before a text the channel held back (too little to post yet) is offered again."""
MAX_FAILURES = 3
"""Updates that may fail in one turn before the turn stops streaming (the answer still
comes, as a whole)."""


def leftover(entries: list[TapeEntry]) -> list[str | None]:
    """The messages a stream left showing partial text (a crash mid-stream), by slot: the
    newest `stream.shown` with the ids that have since been closed set to None; [] when
    none is open."""
    newest: list[Any] | None = None
    closed: set[str] = set()
    for entry in entries:
        if entry.kind != "event":
            continue
        name = entry.payload.get("name")
        data = entry.payload.get("data") or {}
        if name == SHOWN:
            newest = data.get("ids")
        elif name in (REPLY_SENT, REPLY_UNKNOWN, CLOSED):
            closed.update(str(i) for i in data.get("ids") or ())
    if not isinstance(newest, list):
        return []
    slots = [i if isinstance(i, str) and i and i not in closed else None for i in newest]
    return slots if any(slots) else []


def unrecorded_opening(entries: list[TapeEntry]) -> TapeEntry | None:
    """The newest start of a streamed turn that no `stream.shown` of its turn (nor an
    `inbound.done`: its turn ended) follows: a partial may be showing that nobody could
    record yet."""
    opening: TapeEntry | None = None
    for entry in entries:
        if entry.kind != "event":
            continue
        name = entry.payload.get("name")
        data = entry.payload.get("data") or {}
        if name == OPENING and data.get("streams"):
            opening = entry
        elif opening is not None and (
            name == DONE or (name == SHOWN and data.get("turn") == opening.payload["data"]["turn"])
        ):
            opening = None
    return opening


async def await_partial(
    tape: Tape,
    entries: list[TapeEntry],
    wait: float,
    records: Records,
    reread: Callable[[], Awaitable[list[TapeEntry]]],
) -> list[TapeEntry]:
    """`entries`, or after waiting for it, the entries with the `stream.shown` of a partial
    another process began to show and could not record yet (its database connection broke):
    up to `wait` seconds (a lease period; it records it as soon as it reaches the database,
    which is when we do). A dead process never records it: then the partial stays behind,
    and the answer comes as a new message."""
    opening = unrecorded_opening(entries)
    if opening is None:
        return entries
    turn = str(opening.payload["data"]["turn"])
    await records.settled(tape.name)
    if wait <= 0 or records.began_here(tape.name, turn):
        return await reread() if records.began_here(tape.name, turn) else entries
    log.info("stream.waiting session=%s turn=%s wait=%.1fs", tape.session_id, turn, wait)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        await asyncio.sleep(min(WAIT_POLL, max(0.0, deadline - time.monotonic())))
        found = await tape.query(after_id=opening.id, kinds=["event"], names=[SHOWN, DONE])
        if any(e.payload["name"] == DONE or e.payload["data"].get("turn") == turn for e in found):
            log.info("stream.recorded_by_sender session=%s turn=%s", tape.session_id, turn)
            return await reread()
    log.warning("stream.partial_lost session=%s turn=%s: never recorded", tape.session_id, turn)
    return entries


def closed_event(reply: int | None, ids: list[str]) -> TapeEntry:
    """The record of stream messages the final answer did not need (they were removed)."""
    return TapeEntry.event(CLOSED, {"reply": reply, "ids": ids}, context=False)


def open_stream(
    channel: Channel | None,
    target: dict[str, Any],
    settings: Settings,
    entries: list[TapeEntry],
) -> ReplyStream | None:
    """The channel's stream for one reply, if it streams (BUB_STREAM) or has partial
    messages to take over (found in `entries`, the session's entries after its cursor);
    None otherwise."""
    if channel is None or not isinstance(channel, Streams):
        return None
    shown = leftover(entries)
    if shown:
        log.info("stream.adopt channel=%s ids=%s", channel.name, [i for i in shown if i])
    if not settings.stream and not shown:
        return None
    try:
        return channel.stream(target, shown)
    except Exception:
        log.exception("stream.open_failed channel=%s", channel.name)
        return None


def status_text(tools: tuple[str, ...]) -> str:
    """What the bot is doing, from the tools a step calls."""
    names = list(dict.fromkeys(tools))
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"using {shown}…"


class TurnStream:
    """One turn's reply, shown while it is written (see the module).

    Use as `async with`; `progress` is the agent's callback; `settle()` stops the updates
    before the final delivery; `visible()` marks the first text the user saw (also for a
    turn that did not stream: its first delivered piece)."""

    def __init__(
        self,
        stream: ReplyStream | None,
        *,
        tape: Tape,
        turn_id: str,
        channel: str,
        settings: Settings,
        emit: Callable[..., None],
        records: Records | None = None,
    ) -> None:
        self.stream = stream
        self.live = stream is not None and settings.stream
        """Progress goes to the channel (False: the stream only delivers the final answer)."""
        self.tape = tape
        self.turn_id = turn_id
        self.channel = channel
        self._emit = emit
        self.started = time.perf_counter()
        self.first_visible: float | None = None
        configured = settings.stream_interval_ms
        default = getattr(stream, "interval", 1.0) if stream is not None else 1.0
        self.interval = configured / 1000 if configured is not None else float(default)
        self.updates = 0
        self._pending: Progress | None = None
        self._wake = asyncio.Event()
        self._next = 0.0
        self._closed = not self.live
        self._failures = 0
        self._recorded: list[str | None] = list(stream.shown) if stream is not None else []
        self.records = records or Records()
        """Where what the stream shows is recorded (retried through database outages)."""
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> TurnStream:
        if self.live:
            # This process shows this turn's partials: their records are its own.
            self.records.began(self.tape.name, self.turn_id)
            self._task = asyncio.get_running_loop().create_task(
                self._pump(), name=f"stream:{self.turn_id}"
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.settle()

    # -- from the agent (synchronous, once per delta) -----------------------------------------
    def progress(self, event: Progress) -> None:
        """The newest progress of the turn replaces any not yet shown."""
        if self._closed or event.kind == "thinking":
            return  # thinking: the working indicator says enough
        self._pending = event
        self._wake.set()

    # -- the pump -----------------------------------------------------------------------------
    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            delay = self._next - loop.time()
            if delay > 0:
                # settle() wakes us early; new progress just replaces `_pending`.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing(), delay)
            if self._closed:
                return
            event, self._pending = self._pending, None
            if event is None:
                continue
            held = await self._apply(event)
            self._next = loop.time() + (min(self.interval, HELD_RETRY) if held else self.interval)
            if held and self._pending is None:
                self._pending = event
            if self._pending is not None:
                self._wake.set()
            await self._record()

    async def _closing(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()

    async def _apply(self, event: Progress) -> bool:
        """Hand one change to the channel; True when it held the text back."""
        assert self.stream is not None
        try:
            if event.kind == "text":
                if not event.text.strip():
                    return False
                shown = await self.stream.update(event.text)
                if not shown:
                    return True
                self.updates += 1
                self.visible(streamed=True)
            elif event.kind == "tools":
                await self.stream.status(status_text(event.tools))
            elif event.kind == "reset":
                await self.stream.reset()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failures += 1
            log.warning(
                "stream.update_failed channel=%s turn=%s (%d): %s",
                self.channel,
                self.turn_id,
                self._failures,
                exc,
            )
            if self._failures >= MAX_FAILURES:
                log.warning("stream.stopped channel=%s turn=%s", self.channel, self.turn_id)
                self._closed = True
        return False

    async def _record(self) -> None:
        """Write the ids of newly visible partial messages to the tape (for a crash); they
        count as recorded once written (a failed write is retried: `records.py`)."""
        if self.stream is None:
            return
        shown = list(self.stream.shown)
        if shown == self._recorded:
            return
        entry = TapeEntry.event(SHOWN, {"turn": self.turn_id, "ids": shown}, context=False)
        try:
            await self.records.write(self.tape, [entry])
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("stream.record_failed turn=%s", self.turn_id)
            return
        self._recorded = shown

    async def settle(self) -> None:
        """Stop updating (an update in flight finishes first) and record what it showed."""
        if self._task is None:
            self._closed = True
            return
        self._closed = True
        self._wake.set()
        # The answer is ready: a partial update still queued for the platform's budget is
        # dropped (`final_ready`, optional in the contract) instead of going out ahead of it.
        final_ready = getattr(self.stream, "final_ready", None)
        if callable(final_ready):
            final_ready()
        task, self._task = self._task, None
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            raise
        except Exception:
            log.exception("stream.pump_failed turn=%s", self.turn_id)
        await self._record()

    # -- what the user saw ----------------------------------------------------------------------
    def visible(self, *, streamed: bool = False) -> None:
        """The user sees text of the answer now (reported once per turn, for the metric)."""
        if self.first_visible is not None:
            return
        self.first_visible = time.perf_counter() - self.started
        self._emit(
            "first_text", channel=self.channel, seconds=self.first_visible, streamed=streamed
        )
