"""Slack streaming: a reply shown while the model writes it (the `ReplyStream` contract).

In threads (and DM threads) the text streams natively: `chat.startStream` with the model's
Markdown, `chat.appendStream` with what was added, `chat.stopStream` at the end (Slack renders
the Markdown as it grows). Where the workspace or token cannot stream (the method is missing
or not allowed: remembered per team), at the top level of a DM (no thread), or once the text
outgrows `NATIVE_CHARS` or a step starts over (appended text cannot be taken back), the reply
is a message posted with `chat.postMessage` and edited with `chat.update`, cut into
mrkdwn pieces by the same splitter as the final answer (so a partial render never leaves a
code block open); a longer answer continues in new messages in the thread.

The final answer: every message that shows partial text is stopped (if it streams) and
updated to exactly the piece a non-streamed reply would have posted, so the thread ends up the
same either way. A quick answer is not streamed at all: the first message waits until the
text is `FIRST_DELAY` seconds old. The working indicator (assistant status or
reaction) goes on alongside; between steps the status names the tools in use.

Every call goes through `SlackOutbox.call` (429s waited out per method, an unknown outcome
never repeated blindly; an update may be repeated, it is idempotent). The calls that show
partial text are partial requests (channels/pacing.py): in a channel's posting window they go
only when no answer's post could, one that gets a 429 is skipped, and `final_ready()` drops
the one still waiting when the answer is complete, so the answer never waits behind it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .base import DeliveryError, DeliveryUnknown
from .pacing import Dropped
from .slack_format import escape, format_and_split

log = logging.getLogger("channels.slack")

NATIVE_INTERVAL = 1.0
"""Seconds between appends (`chat.appendStream` is Tier 4: 100+ a minute)."""
UPDATE_INTERVAL = 1.5
"""Seconds between edits (`chat.update` is Tier 3: 50+ a minute for the whole workspace)."""
NATIVE_CHARS = 3000
"""A native stream holds at most this much text; beyond it the reply continues as pieces."""
FIRST_DELAY = 0.5
"""Seconds of text before the first message: an answer complete by then is simply posted."""
UPDATE_ATTEMPTS = 3
GONE = ("message_not_found", "cant_update_message", "edit_window_closed", "channel_not_found")

Call = Callable[..., Awaitable[dict[str, Any]]]
"""`SlackOutbox.call(method, params, partial=None)`."""


class NativeStreams:
    """Which teams can use `chat.startStream` (a refusal is remembered for the process)."""

    def __init__(self) -> None:
        self.refused: set[str] = set()

    def refuse(self, team: str, why: str) -> None:
        if team not in self.refused:
            log.info("slack.stream_unavailable team=%s (updates instead): %s", team, why)
        self.refused.add(team)


class _Slot:
    """One message of the reply: its ts, whether it still streams, what it shows."""

    __slots__ = ("native", "shown", "ts")

    def __init__(self, ts: str, *, native: bool, shown: str | None) -> None:
        self.ts = ts
        self.native = native
        """Still streaming (or maybe: a message taken over after a crash)."""
        self.shown = shown
        """Native: the Markdown appended so far; else the mrkdwn shown (None: unknown)."""


class SlackStream:
    """One reply to `target` shown while it is written (see the module)."""

    def __init__(
        self,
        target: dict[str, Any],
        shown: Sequence[str | None],
        *,
        call: Call,
        drop: Callable[[object], int] | None = None,
        native: NativeStreams,
        team: str,
        set_status: Callable[[str], Awaitable[bool]] | None,
    ) -> None:
        self.target = target
        self.channel = str(target["channel"])
        self.thread_ts = target.get("thread_ts")
        self.team = team
        self._outbox_call = call
        self._drop = drop
        self._partial = False
        """Within `update` / `status`: every call is a partial one."""
        self._final = False
        """The answer is ready: partial updates are over."""
        self._native = native
        self._set_status = set_status
        self._slots: list[_Slot | None] = [
            _Slot(ts, native=True, shown=None) if ts else None for ts in shown
        ]
        dm = self.channel.startswith("D")
        self._can_stream = bool(self.thread_ts) and (dm or bool(target.get("user")))
        self.interval = NATIVE_INTERVAL if self._streams() else UPDATE_INTERVAL
        self._born: float | None = None
        self._lost = False
        """A post of ours may exist unseen (its outcome was unknown): post nothing more."""

    @property
    def shown(self) -> list[str | None]:
        return [s.ts if s is not None else None for s in self._slots]

    def _streams(self) -> bool:
        return self._can_stream and self.team not in self._native.refused

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if self._partial:
            return await self._outbox_call(method, params, partial=self)
        return await self._outbox_call(method, params)

    # -- ReplyStream -------------------------------------------------------------------------
    def final_ready(self) -> None:
        """The answer is complete: a partial call still waiting for its turn is dropped (one
        in flight finishes), so the answer does not wait behind it."""
        self._final = True
        if self._drop is not None:
            self._drop(self)

    async def update(self, text: str) -> bool:
        if self._lost or self._final:
            return True
        self._partial = True
        try:
            return await self._update(text)
        except Dropped:
            return False  # nothing new was shown; newer text comes (or the answer)
        finally:
            self._partial = False

    async def _update(self, text: str) -> bool:
        if not any(self._slots):
            now = time.monotonic()
            self._born = self._born or now
            if now - self._born < FIRST_DELAY:
                return False
            if self._streams() and len(text) <= NATIVE_CHARS and await self._start(text):
                return True
        elif len(self._slots) == 1 and (slot := self._slots[0]) is not None and slot.native:
            if slot.shown is not None and text.startswith(slot.shown) and len(text) <= NATIVE_CHARS:
                if len(text) > len(slot.shown):
                    await self._append(slot, text[len(slot.shown) :])
                return True
        await self._show(format_and_split(text))
        return True

    async def status(self, text: str) -> None:
        if self._final:
            return
        if self._set_status is not None and self.thread_ts:
            await self._set_status(f"is {text}")
        if any(self._slots) and not self._lost:
            self._partial = True
            try:
                await self._show([f"_{escape(text)}_"])
            except Dropped:
                pass  # the next update (or the answer) replaces it
            finally:
                self._partial = False

    async def reset(self) -> None:
        return None  # the next text (or the final answer) replaces what is shown

    async def deliver(self, index: int, piece: str) -> list[str] | None:
        slot = self._slots[index] if index < len(self._slots) else None
        if slot is None:
            return None
        await self._stop(slot)
        if slot.shown == piece:
            return [slot.ts]
        if await self._edit(slot, piece, final=True):
            return [slot.ts]
        self._slots[index] = None  # gone (deleted by someone, too old to edit): post anew
        return None

    async def end(self, pieces: int) -> list[str]:
        removed = []
        for index in range(pieces, len(self._slots)):
            slot = self._slots[index]
            if slot is not None:
                await self._delete(slot)
                removed.append(slot.ts)
                self._slots[index] = None
        return removed

    # -- native streams ------------------------------------------------------------------------
    async def _start(self, text: str) -> bool:
        """Start the native stream with `text`; False when this team cannot stream."""
        params: dict[str, Any] = {
            "channel": self.channel,
            "thread_ts": self.thread_ts,
            "markdown_text": text,
        }
        if not self.channel.startswith("D"):
            params["recipient_user_id"] = self.target.get("user")
            params["recipient_team_id"] = self.team
        try:
            response = await self._call("chat.startStream", params)
        except DeliveryUnknown:
            self._lost = True
            raise
        except DeliveryError as exc:
            self._native.refuse(self.team, str(exc))
            return False
        ts = str(response.get("ts") or "")
        if not ts:
            self._native.refuse(self.team, "chat.startStream answered without a ts")
            return False
        self._slots = [_Slot(ts, native=True, shown=text)]
        return True

    async def _append(self, slot: _Slot, added: str) -> None:
        params = {"channel": self.channel, "ts": slot.ts, "markdown_text": added}
        try:
            await self._call("chat.appendStream", params)
        except DeliveryUnknown:
            slot.shown = None  # appended or not: the next change rewrites the message
            raise
        assert slot.shown is not None
        slot.shown += added

    async def _stop(self, slot: _Slot) -> None:
        """End a slot's native stream (it becomes an ordinary message)."""
        if not slot.native:
            return
        slot.native = False
        slot.shown = None  # Slack rendered Markdown; as mrkdwn it shows something else
        with contextlib.suppress(DeliveryError):  # not streaming (any more): nothing to stop
            # Never dropped (not partial): the slot is marked stopped already.
            params = {"channel": self.channel, "ts": slot.ts}
            await self._outbox_call("chat.stopStream", params)

    # -- messages --------------------------------------------------------------------------------
    async def _show(self, pieces: list[str]) -> None:
        """Make the reply's messages show `pieces` (posting what is missing, deleting what is
        left over)."""
        for index, piece in enumerate(pieces):
            slot = self._slots[index] if index < len(self._slots) else None
            if slot is not None:
                await self._stop(slot)
                if slot.shown != piece and not await self._edit(slot, piece, final=False):
                    self._slots[index] = None  # gone: the next update posts it anew
                continue
            if self._lost:
                return
            params: dict[str, Any] = {"channel": self.channel, "text": piece}
            if self.thread_ts:
                params["thread_ts"] = self.thread_ts
            try:
                response = await self._call("chat.postMessage", params)
            except DeliveryUnknown:
                self._lost = True
                raise
            made = _Slot(str(response.get("ts") or ""), native=False, shown=piece)
            if index < len(self._slots):
                self._slots[index] = made
            else:
                self._slots.append(made)
        for slot in self._slots[len(pieces) :]:
            if slot is not None:
                await self._delete(slot)
        del self._slots[len(pieces) :]

    async def _edit(self, slot: _Slot, piece: str, *, final: bool) -> bool:
        """`chat.update` the slot to `piece`; False when the message is gone. A partial
        update gives up on a lost connection; the final one repeats it (it is idempotent)."""
        params = {"channel": self.channel, "ts": slot.ts, "text": piece}
        for attempt in range(1, UPDATE_ATTEMPTS + 1):
            try:
                await self._call("chat.update", params)
                slot.shown = piece
                return True
            except DeliveryUnknown:
                slot.shown = None
                if not final or attempt == UPDATE_ATTEMPTS:
                    raise
            except DeliveryError as exc:
                if any(g in str(exc) for g in GONE):
                    return False
                raise
        return False

    async def _delete(self, slot: _Slot) -> None:
        await self._stop(slot)
        with contextlib.suppress(DeliveryError):
            await self._call("chat.delete", {"channel": self.channel, "ts": slot.ts})
