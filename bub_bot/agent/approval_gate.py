"""The approval gate of the loop: which of a step's calls run, wait for a person, or are
refused, and the `approval.request` entry for the ones that wait (bub_bot/approvals)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..approvals.approvers import Approvers
from ..approvals.policy import ALLOW, ASK, DENY, ApprovalPolicy, ToolFacts
from ..approvals.requests import REQUEST, digest_of, iso, new_request_id, request_text
from ..config import Settings
from ..errors import ConfigError
from ..tape import Counting, Tape, TapeEntry
from ..workspaces import WorkspaceMap, load_workspace_map
from .model import ModelReply
from .tools import Origin, Tool

log = logging.getLogger(__name__)

POLICY_DENIED = "error: this tool is not allowed here (the operator's approval policy denies it)."
SUBAGENT_ASK = (
    "error: this call needs a person's approval, which a subagent cannot ask for; it did not"
    " run. Leave it to the main conversation."
)

ExpirySchedule = Callable[[dict[str, Any], Origin, str], Awaitable[None]]
"""Stores the expiry job of a request (data, origin, tape name) before the request is written."""


class ApprovalGate:
    """Decides each call with the policy of the session's conversation (now)."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.policy = ApprovalPolicy.parse(settings.approve)
        self.approvers = Approvers.parse(settings.approvers)
        self.timeout = settings.approval_timeout_seconds
        self.clock = clock
        self._settings = settings
        self._map: WorkspaceMap | None = None
        self.schedule_expiry: ExpirySchedule | None = None
        """Set by the runtime: the request's expiry job (none: the request never expires)."""

    def _rules(self, session_id: str) -> dict[str, str]:
        if self._map is None:
            try:
                self._map = load_workspace_map(
                    self._settings.workspace_map, self._settings.workspace
                )
            except ConfigError as exc:  # checked at start-up; a file changed since
                log.warning("approvals: %s", exc)
                return {}
        rule = self._map.rule_for(session_id)
        return dict(rule.approve) if rule is not None else {}

    def decide(self, tool: Tool | None, name: str, session_id: str) -> str:
        """`allow`, `ask` or `deny` for a call of `name` (an unknown tool: allow, it fails)."""
        if tool is None:
            return ALLOW
        facts = ToolFacts(tool.name, tool.group, tool.read_only, tool.destructive)
        return self.policy.decide(facts, session_id, self._rules(session_id))

    def policies(
        self, calls: list[dict[str, Any]], resolve: Callable[[str], Tool | None], session_id: str
    ) -> dict[str, str]:
        """Call id -> the policy's word."""
        return {
            c["id"]: self.decide(resolve(c["function"]["name"]), c["function"]["name"], session_id)
            for c in calls
        }

    def screen(
        self,
        calls: list[dict[str, Any]],
        resolve: Callable[[str], Tool | None],
        session_id: str,
        depth: int = 0,
    ) -> tuple[dict[str, str], dict[str, str]]:
        """The policy's word per call id, and the refusals of calls that will not run: a
        subagent (`depth` > 0) has nobody to ask, so its calls that need a click are denied."""
        policies = self.policies(calls, resolve, session_id)
        if depth == 0 or ASK not in policies.values():
            return policies, {}
        fixed = {cid: SUBAGENT_ASK for cid, p in policies.items() if p == ASK}
        return {cid: DENY if p == ASK else p for cid, p in policies.items()}, fixed

    async def hold(
        self,
        tape: Tape,
        reply: ModelReply,
        policies: dict[str, str],
        resolve: Callable[[str], Tool | None],
        origin: Origin,
        turn: tuple[int, str, dict[str, Any]],
        after: list[TapeEntry],
        usage: Counting | None,
    ) -> TapeEntry:
        """Write the step's `approval.request` (then `after`: its run and step events) with
        the call's `usage`, in one transaction; returns the request as written. `turn`:
        (seen through, turn id, payer)."""
        seen_through, turn_id, payer = turn
        request = await self.request(
            reply.tool_calls,
            reply.content,
            policies,
            resolve,
            origin,
            tape.name,
            seen_through,
            turn_id,
            payer=payer,
        )
        written = await tape.append_many([request, *after], usage=usage)
        return written[0]

    async def request(
        self,
        calls: list[dict[str, Any]],
        content: str,
        policies: dict[str, str],
        resolve: Callable[[str], Tool | None],
        origin: Origin,
        tape_name: str,
        seen_through: int,
        turn_id: str,
        payer: dict[str, Any] | None = None,
    ) -> TapeEntry:
        """The `approval.request` entry for a step whose calls include `ask` ones (its expiry
        job is stored first: a crash in between leaves a job that expires nothing). `payer`:
        whom the turn is charged to; its decision carries it as `meta.payer`, so the turn it
        continues is charged to them, not to whoever clicked."""
        rid = new_request_id()
        described = []
        for call in calls:
            tool = resolve(call["function"]["name"])
            described.append(
                {
                    "id": call["id"],
                    "tool": tool.name if tool is not None else call["function"]["name"],
                    "arguments": str(call["function"].get("arguments") or "{}"),
                    "policy": policies.get(call["id"], ALLOW),
                }
            )
        now = self.clock()
        expires = now + self.timeout
        data: dict[str, Any] = {
            "id": rid,
            "calls": described,
            "tool_calls": calls,
            "content": content,
            "digest": digest_of(rid, described),
            "requester": dict(origin.sender),
            "channel": origin.channel,
            "reply_target": dict(origin.reply_target),
            "approvers": self.approvers.describe(origin.channel),
            "created": now,
            "expires": expires,
            "expires_at": iso(expires),
            "seen_through": seen_through,
            "turn": turn_id,
        }
        if payer:
            data["payer"] = dict(payer)
        data["text"] = request_text(data)
        if self.schedule_expiry is not None:
            await self.schedule_expiry(data, origin, tape_name)
        log.info(
            "approval.request session=%s request=%s tools=%s",
            origin.session_id,
            rid,
            ",".join(c["tool"] for c in described if c["policy"] == ASK),
        )
        return TapeEntry.event(REQUEST, data, context=False)


__all__ = ["ALLOW", "ASK", "DENY", "POLICY_DENIED", "SUBAGENT_ASK", "ApprovalGate"]
