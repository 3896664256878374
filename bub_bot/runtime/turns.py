"""Running one turn of a session: the messages before the first queued command go to the agent,
the answer is shown while it is written where the channel streams, and it is delivered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable

from channels.base import Approvals, Channel

from ..agent import Agent, Origin, Progress
from ..approvals.requests import OpenRequest, is_decision, open_requests, settled_text
from ..config import Settings
from ..files.transcribe import Transcriber
from ..tape import TapeEntry, TapeStore
from .attachments import Attachments
from .delivery import Delivery
from .facts import REPLY_SENT, covered, head_through, is_barrier, is_pending
from .session import Session
from .streaming import TurnStream, await_partial, open_stream

log = logging.getLogger("bub_bot.runtime")

FAILED_NOTE = "Sorry, something went wrong while answering. Please try again."


class TurnRunner:
    """Runs a session's turns with the agent and hands the answers to delivery."""

    def __init__(
        self,
        settings: Settings,
        store: TapeStore,
        agent: Agent,
        channels: dict[str, Channel],
        delivery: Delivery,
        slots: asyncio.Semaphore,
        emit: Callable[..., None],
    ) -> None:
        self.settings = settings
        self.attachments = Attachments(
            settings,
            store,
            channels,
            Transcriber(settings.transcribe_model, lambda: agent.model.client),
            budgets=lambda: agent.budgets,
        )
        """Files that came with the messages, fetched in the turn (retried on resume)."""
        self.store = store
        self.agent = agent
        self.channels = channels
        self.delivery = delivery
        self.slots = slots
        """Turns running at once (BUB_MAX_CONCURRENT_TURNS): held while the model works."""
        self._emit = emit

    async def run(
        self,
        session: Session,
        pending: list[TapeEntry],
        items: list[TapeEntry],
        context: list[TapeEntry] | None = None,
    ) -> None:
        """Run the turn at the head of `pending` (read as `items`, with `context`: the tape
        after its last anchor, read with them) and deliver its answer."""
        head = pending[0]
        # A command that `receive` saw arrive after `pending` was read (e.g. while this turn
        # waited for a slot) still holds back what comes after it; one already handled does not.
        queued = session.barrier
        if queued is not None and queued <= (session.cursor or 0):
            queued = None
        session.barrier = None
        messages = []
        for entry in pending:
            if is_barrier(entry):
                session.barrier = entry.id
                break
            messages.append(entry)
        decisions = [e for e in messages if is_decision(e)]
        settled = await self._settle(session, decisions) if decisions else 0
        if decisions and not settled and len(decisions) == len(messages):
            # A decision for a request that is settled or gone (after /reset): nothing to do.
            await self.delivery.mark_done(session, messages[-1].id, stale=True)
            session.barrier = None
            return
        if session.barrier is None:
            session.barrier = queued
        # 48 random bits, as uuid4's first 12 hex digits were, without a system call each.
        turn_id = f"{random.getrandbits(48):012x}"
        channel_name = messages[-1].meta.get("channel", "")
        channel = self.channels.get(channel_name)
        target = messages[-1].meta.get("reply_target") or {}
        log.info(
            "turn.start session=%s channel=%s turn=%s messages=%d",
            session.id,
            channel_name,
            turn_id,
            len(messages),
        )

        def hold_back(entries: list[TapeEntry]) -> list[TapeEntry]:
            barrier = session.barrier
            if barrier is None:
                return entries
            # Copies made after an anchor are held back by the id of their original.
            return [
                e
                for e in entries
                if not (
                    (e.meta.get("inbound") or "copy_of" in e.meta)
                    and e.meta.get("copy_of", e.id) > barrier
                )
            ]

        if await self._carry_into_phase(session, messages, items) or decisions:
            context = None  # written to since it was read
        if any(m.kind == "message" and m.meta.get("attachments") for m in messages):
            context = None  # `resolve` may write the files' messages
        await self.attachments.resolve(session, messages)

        # The reply is shown while it is written when the channel streams (streaming.py); a
        # partial another replica showed and could not record yet is waited for, then taken.
        records = self.delivery.records
        items = await await_partial(
            session.tape,
            items,
            self.delivery.takeover_wait,
            records,
            lambda: session.tape.query(after_id=session.cursor or 0, kinds=["message", "event"]),
        )
        shown = TurnStream(
            open_stream(channel, target, self.settings, items),
            tape=session.tape,
            turn_id=turn_id,
            channel=channel_name,
            settings=self.settings,
            emit=self._emit,
            records=records,
        )
        working = channel.working(target) if channel is not None else contextlib.nullcontext()
        # The indicator stays on until the answer is delivered, not just computed. The turn
        # slot is held while the model works, not while the platform paces the delivery (a
        # busy group's 20 messages a minute must not keep private chats waiting for a slot).
        async with _safe(working, session.id):
            if self.slots.locked():
                context = None  # waiting for a slot: the model reads what arrives meanwhile
            async with self.slots, shown:
                progress = shown.progress if shown.live else None
                if session.dirty:
                    context = None  # something was stored since it was read
                reply, seen = await self._agent_turn(
                    session, turn_id, head, hold_back, channel_name, progress, messages[-1],
                    context,
                )  # fmt: skip
            known = (items[-1].id or 0) if items else 0
            saw_more = reply is None or seen is None or seen > known
            if session.dirty or (session.leased and saw_more):
                # Re-read what is pending now: messages that reached the model mid-turn (here,
                # or on another replica) are covered by this answer.
                items = await session.tape.query(
                    after_id=session.cursor or 0, kinds=["message", "event"]
                )
            else:
                # Nothing stored here since the queue was read, and the model saw nothing
                # newer than it: what this answer covers is in what was read (a message
                # another replica stored meanwhile is newer than what the model saw, so it
                # starts the next turn either way; the read after the release finds it).
                items = pending
            if reply is None:
                through = head_through([e for e in items if is_pending(e)])
                await self.delivery.mark_done(session, through)
                return
            pending_now = [e for e in items if is_pending(e) and e.id < reply.id]
            through = covered(pending_now, reply, seen)
            source = next((e for e in reversed(pending_now) if e.id <= through), messages[-1])
            await self.delivery.finish(
                session,
                source,
                reply,
                through,
                fresh=True,
                stream=shown.stream,
                on_sent=shown.visible,
                adopt=False,
                turn=turn_id,
            )
        session.barrier = None

    async def _settle(self, session: Session, decisions: list[TapeEntry]) -> int:
        """Settle the requests these decisions are for (run or refuse their calls) and show
        the decision where the request was posted; returns how many were settled."""
        found = [r for r in await open_requests(session.tape) if r.decision is not None]
        if not found:
            return 0
        newest = decisions[-1].meta
        origin = Origin(
            session_id=session.id,
            channel=str(newest.get("channel", "")),
            reply_target=dict(newest.get("reply_target") or {}),
            sender=dict(newest.get("sender") or {}),
            via="approval",
            payer=dict(newest.get("payer") or {}),
        )
        settled = await self.agent.settle(session.tape, session.workspace, origin)
        for request in found:
            await self._show_decision(session, request)
        return settled

    async def _show_decision(self, session: Session, request: OpenRequest) -> None:
        """Replace the request's buttons with who decided what (best effort)."""
        data = request.data
        channel = self.channels.get(str(data.get("channel", "")))
        if not isinstance(channel, Approvals) or request.decision is None:
            return
        sent = await session.tape.query(
            after_id=request.entry.id, kinds=["event"], names=[REPLY_SENT]
        )
        ids = [
            str(i)
            for e in sent
            if e.payload["data"].get("reply") == request.entry.id
            for i in e.payload["data"].get("ids", [])
        ]
        decided = request.decision.payload["data"]
        who = decided.get("by") or {}
        by = str(who.get("name") or who.get("id") or "someone")
        text = settled_text(str(decided.get("decision")), by, str(decided.get("at", "")))
        try:
            await channel.settle(dict(data.get("reply_target") or {}), ids, data, text)
        except Exception as exc:
            log.warning("approval.update_failed session=%s: %s", session.id, exc)

    async def _agent_turn(
        self,
        session: Session,
        turn_id: str,
        head: TapeEntry,
        hold_back: Callable[[list[TapeEntry]], list[TapeEntry]],
        channel_name: str,
        progress: Callable[[Progress], None] | None = None,
        newest: TapeEntry | None = None,
        context: list[TapeEntry] | None = None,
    ) -> tuple[TapeEntry | None, int | None]:
        """Run the agent; returns the reply entry and the newest entry id the model saw.

        A failure of any kind becomes a short note to the user and an `error` entry."""
        started = time.perf_counter()
        meta = newest.meta if newest is not None else {}
        origin = Origin(
            session_id=session.id,
            channel=channel_name,
            reply_target=dict(meta.get("reply_target") or {}),
            sender=dict(meta.get("sender") or {}),
            via=str(meta.get("origin") or ""),
            payer=dict(meta.get("payer") or {}),
        )

        async def before_step(step: int) -> None:
            # Files on messages that arrived during the turn reach the model at its next
            # step like their text does (the turn's own were fetched before step 1).
            if step > 1:
                fresh = await session.tape.query(after_id=head.id, kinds=["message"])
                arrived = [e for e in hold_back(fresh) if e.meta.get("inbound")]
                await self.attachments.resolve(session, arrived)

        try:
            result = await self.agent.run_turn(
                session.tape,
                before_step=before_step,
                workspace=session.workspace,
                entry_filter=hold_back,
                turn_id=turn_id,
                turn_start=head.id - 1,
                progress=progress,
                origin=origin,
                context=context,
                bootstrapped=True,  # ingress wrote the anchor with the session's first message
            )
        except Exception as exc:
            log.exception("turn.failed session=%s turn=%s", session.id, turn_id)
            written = await session.tape.append_many(
                [
                    TapeEntry.error("turn", f"{type(exc).__name__}: {exc}"),
                    TapeEntry.event(
                        "turn.notice", {"status": "error", "text": FAILED_NOTE}, context=False
                    ),
                ]
            )
            self._emit("turn", channel=channel_name, outcome="error")
            return written[-1], None
        outcome = "auto_handoff" if result.auto_handoff and result.status == "ok" else result.status
        self._emit("turn", channel=channel_name, outcome=outcome)
        log.info(
            "turn.end session=%s turn=%s status=%s steps=%d elapsed_ms=%.0f",
            session.id,
            turn_id,
            result.status,
            result.steps,
            (time.perf_counter() - started) * 1000,
        )
        reply = result.entry
        if reply is None and result.reply_entry:
            reply = await self.store.get(session.tape.name, result.reply_entry)
        # Messages that arrived while the last model call was in flight are older than the
        # reply but were never seen: they start the next turn.
        return reply, max(result.seen_through, head.id)

    async def _carry_into_phase(
        self, session: Session, messages: list[TapeEntry], items: list[TapeEntry]
    ) -> bool:
        """Copy this turn's messages that sit before the last anchor (they queued behind a
        `/handoff`) to after it, so the model sees them; once, also across a restart."""
        first = messages[0].id
        if not any(
            e.kind == "event" and e.payload.get("name") == "handoff" and e.id > first for e in items
        ):
            return False  # no handoff since these messages arrived (the usual case: no read)
        anchor = (await self.store.stats(session.tape.name)).last_anchor_id
        behind = [e for e in messages if e.id < anchor]
        if not behind:
            return False
        after = await session.tape.query(after_id=anchor, kinds=["message"], names=["user"])
        present = {e.meta.get("copy_of") for e in after}
        copies = [e.copy_after_anchor() for e in behind if e.id not in present]
        if copies:
            await session.tape.append_many(copies)
        return bool(copies)


@contextlib.asynccontextmanager
async def _safe(indicator: contextlib.AbstractAsyncContextManager[None], session_id: str):
    """Run a working-indicator without letting its failures touch the turn."""
    entered = False
    try:
        await indicator.__aenter__()
        entered = True
    except Exception as exc:
        log.warning("indicator.failed session=%s: %s", session_id, exc)
    try:
        yield
    finally:
        if entered:
            try:
                await indicator.__aexit__(None, None, None)
            except Exception as exc:
                log.warning("indicator.failed session=%s: %s", session_id, exc)
