"""Approval requests in Slack: Block Kit Approve / Deny buttons, presses over interactivity
(HTTP `payload` forms and Socket Mode envelopes, checked in `slack_events` like events), the
buttons replaced by who decided what once the request is settled.

A press is stored (`runtime.decide`) before Slack is answered. A press the runtime does not
know (no such request in that conversation, a digest that does not match: forged or replayed)
gets HTTP 400 (Socket Mode: an ignored ack) and runs nothing; a presser who may not decide, a
request already decided or expired: an ephemeral note to the presser, nothing changes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from .base import (
    CLICK_APPROVED,
    CLICK_DENIED,
    CLICK_UNKNOWN,
    ApprovalClick,
    RuntimeLike,
    Sender,
    click_note,
)
from .slack_outbox import SlackOutbox

log = logging.getLogger("channels.slack")

SECTION_LIMIT = 2900
"""Characters of a section's text (Slack allows 3000)."""


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def request_blocks(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The request as a section and the two buttons, bound to the request and its digest."""
    body = _escape(request["text"].rsplit("\nReply /approve", 1)[0])
    if len(body) > SECTION_LIMIT:
        body = body[:SECTION_LIMIT] + "…"
    value = f"{request['id']}:{request['digest']}"
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": body}},
        {
            "type": "actions",
            "block_id": f"bub_approval_{request['id']}",
            "elements": [
                {
                    "type": "button",
                    "action_id": "bub_approval_approve",
                    "text": {"type": "plain_text", "text": "Approve"},
                    "style": "primary",
                    "value": value,
                },
                {
                    "type": "button",
                    "action_id": "bub_approval_deny",
                    "text": {"type": "plain_text", "text": "Deny"},
                    "style": "danger",
                    "value": value,
                },
            ],
        },
    ]


class SlackApprovals:
    """Posts requests, settles them, and turns presses into decisions."""

    def __init__(self, outbox: SlackOutbox, team_id: Any) -> None:
        self.outbox = outbox
        self._team = team_id
        self._tasks: set[asyncio.Task[Any]] = set()

    async def ask(self, target: dict[str, Any], request: dict[str, Any]) -> list[str]:
        if target.get("ephemeral") or not target.get("channel"):
            return await self.outbox.send(target, request["text"])  # /approve, /deny
        params: dict[str, Any] = {
            "channel": target["channel"],
            "text": request["text"],
            "blocks": json.dumps(request_blocks(request)),
        }
        if target.get("thread_ts"):
            params["thread_ts"] = target["thread_ts"]
        response = await self.outbox.call("chat.postMessage", params)
        return [str(response.get("ts") or "")]

    async def settle(
        self, target: dict[str, Any], ids: list[str], request: dict[str, Any], text: str
    ) -> None:
        if target.get("ephemeral") or not target.get("channel"):
            return
        kept = _escape(request["text"].rsplit("\nReply /approve", 1)[0])[:SECTION_LIMIT]
        blocks = [
            {"type": "section", "text": {"type": "mrkdwn", "text": kept}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": _escape(text)}]},
        ]
        for ts in ids:
            await self.outbox.call(
                "chat.update",
                {
                    "channel": target["channel"],
                    "ts": ts,
                    "text": f"{request['text']}\n{text}",
                    "blocks": json.dumps(blocks),
                },
            )

    async def press(self, body: dict[str, Any], runtime: RuntimeLike) -> int:
        """One press (a cleaned `block_actions` body); returns the HTTP status to answer."""
        team = body["team"] or self._team()
        thread = body["thread_ts"]
        session = f"slack:{team}:{body['channel']}" + (f":{thread}" if thread else "")
        request_id, digest = body["value"].split(":")
        outcome = await runtime.decide(
            ApprovalClick(
                channel="slack",
                session_id=session,
                request_id=request_id,
                digest=digest,
                decision=body["action"],
                user=Sender(body["user"], body["user_name"] or body["user"]),
                key=f"action:{body['action_ts']}:{body['user']}" if body["action_ts"] else "",
            )
        )
        if outcome == CLICK_UNKNOWN:
            runtime.note_inbound("slack", "malformed")
            return 400
        if outcome not in (CLICK_APPROVED, CLICK_DENIED):
            params = {"channel": body["channel"], "user": body["user"], "text": click_note(outcome)}
            if thread:
                params["thread_ts"] = thread
            task = asyncio.get_running_loop().create_task(self._note(params))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return 200

    async def _note(self, params: dict[str, Any]) -> None:
        try:
            await self.outbox.call("chat.postEphemeral", params)
        except Exception as exc:
            log.warning("slack.approval_note_failed channel=%s: %s", params["channel"], exc)
