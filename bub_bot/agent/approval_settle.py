"""Settling decided approval requests: the approved calls run once (an `approval.started`
marker goes first; a restart after it reports the run as interrupted instead of running it
again), denied and expired ones get a result the model sees, and the step's `tool_call` with
all its results and `approval.closed` are written in one transaction."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..approvals.requests import (
    APPROVE,
    CLOSED,
    EXPIRED,
    STARTED,
    OpenRequest,
    denied_result,
    open_requests,
    settled_text,
)
from ..tape import Tape, TapeEntry
from .approval_gate import ALLOW, ASK, DENY, POLICY_DENIED
from .tools import ToolContext

log = logging.getLogger("bub_bot.agent.loop")

RunTools = Callable[..., Awaitable[list[TapeEntry]]]
Notify = Callable[[str, dict[str, Any]], None]
PolicyNow = Callable[[str], str]
"""A tool name -> the approval policy's word for it in this session now."""


async def settle(
    ctx: ToolContext,
    tape: Tape,
    run_tools: RunTools,
    notify: Notify,
    policy_now: PolicyNow | None = None,
) -> int:
    """Settle the tape's requests that have a decision: run the approved calls (once:
    an `approval.started` marker goes first, and a restart after it reports the run as
    interrupted instead of running it again), give denied and expired ones a result the
    model sees, and write the step's `tool_call` with all its results and
    `approval.closed` in one transaction. Returns how many requests were settled.
    `policy_now`: a call the operator's policy denies by now (changed since the request)
    does not run, approved or not."""
    found = [r for r in await open_requests(tape) if r.decision is not None]
    if not found:
        return 0
    for request in found:
        await _settle_one(ctx, tape, request, run_tools, notify, policy_now)
    return len(found)


async def _settle_one(
    ctx: ToolContext,
    tape: Tape,
    request: OpenRequest,
    run_tools: RunTools,
    notify: Notify,
    policy_now: PolicyNow | None,
) -> None:
    data = request.data
    assert request.decision is not None
    decided = request.decision.payload["data"]
    choice = str(decided.get("decision"))
    who = decided.get("by") or {}
    by = str(who.get("name") or who.get("id") or "someone")
    if choice != EXPIRED and decided.get("digest") != data.get("digest"):
        choice, by = "deny", "a decision that did not match this request"
    policies: dict[str, str] = {}
    fixed: dict[str, str] = {}
    for call in data["calls"]:
        if call["policy"] == ASK:
            if choice == APPROVE:
                policies[call["id"]] = ALLOW
            else:
                policies[call["id"]] = DENY
                fixed[call["id"]] = denied_result(choice, by)
        else:
            policies[call["id"]] = call["policy"]
        if policies[call["id"]] == ALLOW and policy_now is not None:
            if policy_now(call["tool"]) == DENY:
                policies[call["id"]] = DENY
                fixed[call["id"]] = POLICY_DENIED
    runs = [cid for cid, p in policies.items() if p == ALLOW]
    if request.started:
        for cid in runs:  # it may have run, in part: never twice
            policies[cid] = DENY
            fixed[cid] = (
                "error: the bot restarted while this call was running; it may have run"
                " in part and was not run again."
            )
    elif runs:
        await tape.append(
            TapeEntry.event(STARTED, {"request": data["id"], "calls": runs}, context=False)
        )
    entries = await run_tools(
        ctx, tape, data["tool_calls"], str(data.get("content") or ""), policies, fixed
    )
    at = str(decided.get("at", ""))
    entries.append(
        TapeEntry.event(
            CLOSED,
            {
                "request": data["id"],
                "decision": choice,
                "by": who,
                "at": at,
                "text": settled_text(choice, by, at),
            },
            context=False,
        )
    )
    entries.extend(ctx.records)  # what the calls' subagents recorded
    ctx.records = []
    if ctx.deferred:
        entries.extend(ctx.deferred)
        ctx.deferred = []
        ctx.handed_off = False
    await tape.append_many(entries)
    log.info(
        "approval.closed session=%s request=%s decision=%s ran=%d",
        tape.session_id,
        data["id"],
        choice,
        0 if request.started or choice != APPROVE else len(runs),
    )
    notify("approval", {"outcome": choice})
