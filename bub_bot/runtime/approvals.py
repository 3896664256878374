"""Approval decisions entering sessions: a press (or `/approve`, `/deny`) is checked against
the request on the tape and stored like an inbound message (deduplicated by the request's one
decision key, which the expiry job shares), then wakes the session on any replica."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from channels.base import (
    CLICK_ALREADY,
    CLICK_EXPIRED,
    CLICK_NOT_ALLOWED,
    CLICK_UNKNOWN,
    ApprovalClick,
    Inbound,
)

from ..agent import Agent, Origin
from ..approvals.expiry import KIND, decision_entry, expiry_job_id
from ..approvals.requests import APPROVE, DENY_, EXPIRED, decision_key, find_request, open_requests
from ..commands import strip_mention
from ..tape import Tape, TapeStore
from ..tape.jobs import Job
from .ingress import Arrival, Ingress
from .placement import Placement

log = logging.getLogger("bub_bot.runtime")

_COMMAND = re.compile(r"^/(approve|deny)(?:@\S+)?(?:\s+([0-9a-f]{12}))?\s*$")


class ApprovalDesk:
    """Checks and stores decisions; stores each request's expiry job."""

    def __init__(
        self,
        store: TapeStore,
        agent: Agent,
        ingress: Ingress,
        placement: Placement,
        added: Callable[[Job], None],
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.gate = agent.gate
        self.ingress = ingress
        self.placement = placement
        self.added = added
        self.clock = clock
        agent.gate.schedule_expiry = self.schedule_expiry

    async def schedule_expiry(self, data: dict[str, Any], origin: Origin, tape_name: str) -> None:
        """The request's expiry: a one-off job whose decision shares the click's key."""
        tape = Tape(self.store, tape_name, origin.session_id)
        workspace = await self.placement.recorded_workspace(tape)
        job = Job(
            id=expiry_job_id(data["id"]),
            kind=KIND,
            session_id=origin.session_id,
            tape=tape_name,
            workspace=str(workspace),
            channel=origin.channel,
            due=float(data["expires"]),
            data={
                "request": data["id"],
                "digest": data["digest"],
                "reply_target": dict(origin.reply_target),
                "payer": dict(data.get("payer") or {}),
            },
        )
        await self.store.add_job(job)
        self.added(job)

    async def decide(self, click: ApprovalClick) -> str:
        """Check `click` against its request and store it; a `CLICK_*` outcome."""
        tape = await self.placement.session_tape(click.session_id)
        request, state = await find_request(tape, click.request_id)
        if request is None or request.payload["data"].get("digest") != click.digest:
            log.warning(
                "approval.forged session=%s request=%s user=%s: %s",
                click.session_id,
                click.request_id,
                click.user.id,
                "no such request" if request is None else "digest does not match",
            )
            return CLICK_UNKNOWN
        data = request.payload["data"]
        if state is not None:
            return CLICK_ALREADY
        requester = str((data.get("requester") or {}).get("id", ""))
        if not self.gate.approvers.allowed(click.channel, click.user.id, requester):
            log.info(
                "approval.refused session=%s request=%s user=%s",
                click.session_id,
                click.request_id,
                click.user.id,
            )
            return CLICK_NOT_ALLOWED
        now = self.clock()
        expired = now >= float(data.get("expires", 0))
        entry = decision_entry(
            click.request_id,
            click.decision,
            by={"id": click.user.id, "name": click.user.name or click.user.id},
            at=now,
            digest=click.digest,
            channel=click.channel,
            reply_target=dict(data.get("reply_target") or {}),
            via="approval",
            payer=data.get("payer") or None,
        )
        keys = [decision_key(click.request_id)]
        if expired:
            # Stored here too (the same key as the expiry job's: one wins), so a request
            # expires even where no timer runs (`bub-bot chat`) or the job is late.
            by_timeout = decision_entry(
                click.request_id,
                EXPIRED,
                by={"id": "", "name": "timeout"},
                at=float(data["expires"]),
                digest=click.digest,
                channel=click.channel,
                reply_target=dict(data.get("reply_target") or {}),
                via="approval.expiry",
                payer=data.get("payer") or None,
            )
            await self.ingress.enter(
                Arrival(click.session_id, None, click.channel, by_timeout, tuple(keys))
            )
            return CLICK_EXPIRED
        if click.key:
            keys.append(f"{click.channel}:{click.key}")
        received = await self.ingress.enter(
            Arrival(click.session_id, None, click.channel, entry, tuple(keys))
        )
        if not received.new:
            return CLICK_ALREADY
        log.info(
            "approval.decision session=%s request=%s decision=%s user=%s",
            click.session_id,
            click.request_id,
            click.decision,
            click.user.id,
        )
        return click.decision

    async def command(self, inbound: Inbound) -> str | None:
        """`/approve [id]` / `/deny [id]` typed in the conversation: decided like a press
        (None: the text is no such command)."""
        found = _COMMAND.match(strip_mention(inbound.text, inbound.bot_names).strip())
        if found is None:
            return None
        tape = await self.placement.session_tape(inbound.session_id, inbound.workspace)
        waiting = [r for r in await open_requests(tape) if r.decision is None]
        chosen = [r for r in waiting if found.group(2) in (None, r.id)]
        if not chosen:
            return CLICK_UNKNOWN
        request = chosen[-1]
        return await self.decide(
            ApprovalClick(
                channel=inbound.channel,
                session_id=inbound.session_id,
                request_id=request.id,
                digest=str(request.data.get("digest", "")),
                decision=APPROVE if found.group(1) == "approve" else DENY_,
                user=inbound.sender,
                key=inbound.delivery_key,
            )
        )
