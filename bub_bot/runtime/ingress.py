"""Ingress: how work enters a session. Everything a session handles arrives as one entry on
its tape with dedupe keys (an `Arrival`), written in one transaction, and then wakes the
session's worker; a re-delivery finds its keys recorded and changes nothing.

An inbound chat message (or command) is one kind of arrival (`inbound_arrival`); work that
comes later into a session the same way (stored, deduplicated, leased) makes its own
`Arrival` and goes through `Ingress.enter` like a message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from channels.base import Attachment, Inbound, Received

from .. import commands
from ..budgets import Budgets
from ..tape import Counting, Tape, TapeEntry, TapeStore
from .facts import command_name
from .placement import Placement
from .replicas import Replicas
from .session import Sessions

log = logging.getLogger("bub_bot.runtime")


@dataclass(frozen=True, slots=True)
class Arrival:
    """One entry for a session's queue and the dedupe keys that make it arrive once."""

    session_id: str
    workspace: Path | None
    """The workspace its source gives the session; None: the one `Placement` decides."""
    channel: str
    """Where it came from: its metrics and the channel's last inbound time."""
    entry: TapeEntry
    keys: tuple[str, ...]
    """Dedupe keys, each unique forever (`<channel>:<platform id>`): any one recorded
    already makes this a duplicate."""
    before: tuple[TapeEntry, ...] = ()
    """Entries written before `entry` in its transaction when the tape is new (a thread's
    history); dropped on a tape that has entries already."""


def inbound_arrival(inbound: Inbound) -> Arrival:
    """An inbound message as `receive` stores it: a user message, or a `command` event when
    its text is a chat command; keyed by its delivery key and extra keys."""
    command = commands.parse(inbound.text, inbound.bot_names)
    meta: dict[str, Any] = {
        "inbound": True,
        "channel": inbound.channel,
        "delivery_key": inbound.delivery_key,
        "message_id": inbound.message_id,
        "sender": {"id": inbound.sender.id, "name": inbound.sender.name},
        "reply_target": inbound.reply_target,
    }
    if inbound.meta:
        meta["platform"] = inbound.meta
    if inbound.sent_at is not None:
        meta["sent_at"] = inbound.sent_at
    if inbound.attachments:
        # Only the platform's description: the bytes are fetched in the turn (attachments.py).
        meta["attachments"] = [a.to_json() for a in inbound.attachments]
    if command is not None:
        data = {**command.to_json(), "text": inbound.text, "bot_names": list(inbound.bot_names)}
        entry = TapeEntry.event("command", data, **meta)
    else:
        content: Any = inbound.text
        if inbound.images:
            content = [{"type": "text", "text": inbound.text or "(image)"}]
            content += [{"type": "image_url", "image_url": {"url": u}} for u in inbound.images]
        elif inbound.attachments and not inbound.text:
            content = ", ".join(_attachment_note(a) for a in inbound.attachments)
        entry = TapeEntry.message({"role": "user", "content": content}, **meta)
    keys = [f"{inbound.channel}:{inbound.delivery_key}"]
    keys += [f"{inbound.channel}:{k}" for k in inbound.extra_keys]
    before = tuple(
        TapeEntry.message(
            {
                "role": h.role,
                "content": h.text if h.role == "assistant" else f"[{h.author}]: {h.text}",
            },
            history=True,
            channel=inbound.channel,
            author=h.author,
        )
        for h in inbound.history
    )
    return Arrival(
        session_id=inbound.session_id,
        workspace=inbound.workspace,
        channel=inbound.channel,
        entry=entry,
        keys=tuple(keys),
        before=before,
    )


def _attachment_note(attachment: Attachment) -> str:
    """What a message that is only a file says until the file is fetched in the turn."""
    kind = "voice message" if attachment.kind == "voice" else attachment.kind
    return f"[{kind}: {attachment.name}]" if attachment.name else f"[{kind}]"


def _keep_history(counting: Counting | None, before: list[TapeEntry]) -> Counting | None:
    """`counting` whose `decide` (a refused message and its notice) keeps the thread's
    history in front: a refused mention still gives the new tape its thread."""
    if counting is None or counting.decide is None or not before:
        return counting
    decide = counting.decide

    def with_history(counts: list[int]) -> list[TapeEntry] | None:
        replaced = decide(counts)
        return None if replaced is None else [*before, *replaced]

    return replace(counting, decide=with_history)


class Ingress:
    """Stores arrivals durably and wakes their sessions."""

    def __init__(
        self,
        store: TapeStore,
        placement: Placement,
        sessions: Sessions,
        replicas: Replicas,
        emit: Callable[..., None],
        budgets: Budgets | None = None,
    ) -> None:
        self.budgets = budgets
        """Counts each user message (with it, one transaction) and refuses one over a rate."""
        self.store = store
        self.placement = placement
        self.sessions = sessions
        self.replicas = replicas
        self._emit = emit
        self.last_inbound: dict[str, float] = {}
        """Channel -> when something last arrived from it (monotonic), for health checks."""

    async def enter(self, arrival: Arrival) -> Received:
        """Write `arrival` on its session's tape with its dedupe keys (one transaction, the
        session's bootstrap anchor first on a new tape), then wake the session. The session
        and workspace are the ones `Placement` decides (a moved session continues another's
        tape). Returns once it is on disk and (several replicas) its session's lease was
        tried; a duplicate returns `Received(new=False)` and changes nothing."""
        session_id, workspace = await self.placement.locate(arrival.session_id, arrival.workspace)
        # Only look the session up here: a duplicate must not leave a Session behind.
        known = self.sessions.get(session_id)
        tape = (
            known.tape if known is not None else Tape.for_session(self.store, session_id, workspace)
        )
        before = list(arrival.before)
        if before and await self.store.query(tape.name, limit=1):
            before = []  # the tape is the history from its first entry on
        counting = None
        if self.budgets is not None and arrival.entry.meta.get("origin") != "schedule":
            # A scheduled message is the operator's schedule, not a person writing: not rated.
            counting = _keep_history(self.budgets.inbound(session_id, arrival.entry), before)
        written = await self.store.append_many(
            tape.name,
            [*before, arrival.entry],
            dedupe_keys=arrival.keys,
            bootstrap=Tape.bootstrap_anchor(workspace),
            session_id=session_id,
            usage=counting,
        )
        self.last_inbound[arrival.channel] = time.monotonic()
        if written is None:
            log.info("inbound.duplicate session=%s key=%s", session_id, arrival.keys[0])
            self._emit("inbound", channel=arrival.channel, outcome="duplicate")
            if self.replicas.shared and not self.sessions.closing:
                # The replica that stored it may have died before taking the lease (it never
                # acknowledged, so this is the platform's re-delivery): look at the session.
                await self.replicas.claim(self.sessions.open(session_id, workspace))
            return Received(new=False)
        entry = written[len(before)]  # the history first, a refusal's notice after it
        if before:
            log.info("inbound.history session=%s messages=%d", session_id, len(before))
        refused = entry.meta.get("refused")
        if refused:
            log.info(
                "inbound.refused session=%s entry=%d reason=%s note=%s",
                session_id,
                entry.id,
                refused["reason"],
                refused["note"],
            )
            self._emit("refusal", reason=refused["reason"])
        command = command_name(entry)
        log.info(
            "inbound.new session=%s channel=%s entry=%d%s",
            session_id,
            arrival.channel,
            entry.id,
            f" command=/{command}" if command is not None else "",
        )
        self._emit("inbound", channel=arrival.channel, outcome="new")
        if self.budgets is not None and self.budgets.limits.any_rate:
            await self.budgets.prune()  # housekeeping of short windows, hourly
        await self.wake(session_id, workspace, entry)
        return Received(new=True, entry_id=entry.id)

    async def wake(self, session_id: str, workspace: Path, entry: TapeEntry) -> None:
        """Wake the session `entry` was stored for (by `enter`, or by a transaction of its
        own, like a due job's that also advances the job); returns once its lease was tried,
        as `enter` does."""
        # The worker may have finished (and forgotten this session) while we were writing.
        session = self.sessions.open(session_id, workspace)
        if command_name(entry) is not None and session.running:
            barrier = session.barrier
            if barrier is None or barrier <= (session.cursor or 0):  # none, or one handled
                session.barrier = entry.id
        await self.replicas.claim(session)
