"""Metering a turn's model calls: whom they are charged to, and the counters each call adds
(written by the loop with the call's `run` event, in one store transaction). The check before
each call is `Budgets.check(payer)`; calls outside the loop use `Budgets.charge`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..budgets import Budgets, Payer, step_usage
from ..tape import Counting
from .model import ModelReply
from .tools import Origin


def payer_of(origin: Origin, session_id: str) -> Payer:
    """Whom a turn's model calls are charged to: `origin.payer` when given (subagents,
    approvals), else the sender of the message it answers (a scheduled job's creator)."""
    meta: dict[str, Any] = {"channel": origin.channel, "sender": origin.sender}
    if origin.payer:
        meta["payer"] = origin.payer
    return Payer.of(origin.session_id or session_id, meta)


def charge_of(origin: Origin, session_id: str, parent: dict[str, Any] | None) -> Payer:
    """Whom a turn's model calls are charged to: a subagent's `parent` payer (its parent
    turn's origin: session, channel, sender) when given, else `payer_of(origin)`."""
    if parent is None:
        return payer_of(origin, session_id)
    meta = {"channel": parent.get("channel", ""), "sender": parent.get("sender") or {}}
    return Payer.of(str(parent.get("session_id") or session_id), meta)


def step_counting(
    budgets: Budgets,
    payer: Payer,
    reply: ModelReply,
    sent: list[dict[str, Any]],
    channel: str,
    notify: Callable[[str, dict[str, Any]], None],
) -> Counting:
    """The counters one call adds; `notify("usage", ...)` feeds the metrics (channel and
    model labels only)."""
    answer = reply.content + "".join(
        str(c.get("function", {}).get("arguments", "")) for c in reply.tool_calls
    )
    used = step_usage(reply.usage, sent, answer)
    notify(
        "usage",
        {
            "channel": channel,
            "model": reply.model,
            "tokens_in": used.tokens_in,
            "tokens_out": used.tokens_out,
            "cost": budgets.cost(reply.model, used),
        },
    )
    return budgets.step(payer, reply.model, used)
