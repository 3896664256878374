"""Approval requests on the tape: bound to the exact calls, decided once.

Entries (all `event`s, none model input):

- `approval.request` (a reply: its `text` goes to the user, with buttons where the channel
  has them): the request id, the step's assistant text and its calls (tool, arguments, the
  policy's word for each), a digest over all of it, who asked, when it expires. The step's
  `tool_call` entry is *not* written yet: it is written with all its results when the request
  is decided, so the model's context never holds a call without its result.
- `approval.decision` (an inbound entry, like a message): `approve`, `deny` or `expired`, by
  whom, for which request and digest; its dedupe key `approval:<id>:decision` is shared by a
  click, `/approve`, `/deny` and the expiry job, so exactly one decision is ever stored.
- `approval.started`: the approved calls are about to run (a restart after it never runs them
  again: the result says the run was interrupted).
- `approval.closed`: the request is settled (with the `tool_call` and `tool_result` entries).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..tape import Tape, TapeEntry

REQUEST = "approval.request"
DECISION = "approval.decision"
STARTED = "approval.started"
CLOSED = "approval.closed"
APPROVE, DENY_, EXPIRED = "approve", "deny", "expired"
ARG_PREVIEW = 600
"""Characters of a call's arguments shown in the request message."""


def decision_key(request_id: str) -> str:
    """The one dedupe key every decision of a request carries (first stored wins)."""
    return f"approval:{request_id}:decision"


def digest_of(request_id: str, calls: list[dict[str, Any]]) -> str:
    """What a button is bound to: the request id and the exact calls (tool, arguments)."""
    body = json.dumps(
        [request_id, [[c["id"], c["tool"], c["arguments"]] for c in calls]],
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def new_request_id() -> str:
    return uuid.uuid4().hex[:12]


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def request_text(data: dict[str, Any]) -> str:
    """The request message in plain words (channels without buttons: with the commands)."""
    asked = [c for c in data["calls"] if c["policy"] == "ask"]
    lines = [
        "Approval needed: I want to run" + (":" if len(asked) == 1 else f" {len(asked)} calls:")
    ]
    for call in asked:
        lines.append(f"• {describe_call(call['tool'], call['arguments'])}")
    lines.append(
        f"Who may decide: {data.get('approvers', 'the person who asked')}."
        f" Expires {data['expires_at']} UTC."
    )
    lines.append(f"Reply /approve {data['id']} or /deny {data['id']}.")
    return "\n".join(lines)


def _lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def describe_call(tool: str, arguments: str) -> str:
    """What will run, for a person: the command of `bash`, the file and a size or diff
    summary for writes and edits, else the tool and its arguments (cut)."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        args = None
    if not isinstance(args, dict):
        cut = arguments if len(arguments) <= ARG_PREVIEW else arguments[:ARG_PREVIEW] + "…"
        return f"{tool} {cut}"
    command = args.get("cmd", args.get("command"))  # the bash tool's argument is `cmd`
    if tool == "bash" and isinstance(command, str):
        shown = command if len(command) <= ARG_PREVIEW else command[:ARG_PREVIEW] + "…"
        return f"bash: $ {shown}"
    path = args.get("path")
    if isinstance(path, str):
        parts = [f"{tool} {path}"]
        removed = sum(
            _lines(v) for k, v in args.items() if k.startswith("old") and isinstance(v, str)
        )
        added = sum(
            _lines(v) for k, v in args.items() if k.startswith("new") and isinstance(v, str)
        )
        if removed or added:
            parts.append(f"(-{removed} +{added} lines)")
        for key, value in args.items():
            if key == "path" or key.startswith(("old", "new")):
                continue
            if isinstance(value, str) and len(value) > 80:
                parts.append(f"({key}: {_lines(value)} lines, {len(value)} characters)")
            else:
                parts.append(f"{key}={json.dumps(value, ensure_ascii=False)[:80]}")
        return " ".join(parts)
    cut = arguments if len(arguments) <= ARG_PREVIEW else arguments[:ARG_PREVIEW] + "…"
    return f"{tool} {cut}"


def settled_text(decision: str, by: str, at: str) -> str:
    """What replaces the buttons once a request is settled."""
    if decision == APPROVE:
        return f"Approved by {by} at {at} UTC."
    if decision == DENY_:
        return f"Denied by {by} at {at} UTC."
    return f"Not approved in time (expired {at} UTC)."


def denied_result(decision: str, by: str) -> str:
    """The tool result the model sees for a call that will not run."""
    if decision == EXPIRED:
        return "error: not approved in time; the call did not run."
    return f"error: denied by {by}; the call did not run."


@dataclass(frozen=True, slots=True)
class OpenRequest:
    """A request found on a tape, with its decision if one is stored."""

    entry: TapeEntry
    decision: TapeEntry | None
    started: bool

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def data(self) -> dict[str, Any]:
        return self.entry.payload["data"]


NAMES = [REQUEST, DECISION, STARTED, CLOSED]


async def open_requests(tape: Tape, limit: int = 50) -> list[OpenRequest]:
    """The tape's requests that are not closed yet, oldest first (a few at most: a session
    waits on one request at a time)."""
    return open_in(await tape.query(**REQUESTS_VIEW, limit=limit))


REQUESTS_VIEW: dict[str, Any] = {"kinds": ["event"], "names": NAMES, "newest_first": True}
"""The query `open_in` reads (with a limit): the requests' events, newest first."""


def open_in(found: list[TapeEntry]) -> list[OpenRequest]:
    """`open_requests` of the entries `REQUESTS_VIEW` found (e.g. read with other queries)."""
    closed: set[str] = set()
    decisions: dict[str, TapeEntry] = {}
    started: set[str] = set()
    result: list[OpenRequest] = []
    for entry in found:  # newest first
        data = entry.payload.get("data", {})
        name = entry.payload.get("name")
        rid = str(data.get("request", data.get("id", "")))
        if name == CLOSED:
            closed.add(rid)
        elif name == DECISION:
            decisions.setdefault(rid, entry)
        elif name == STARTED:
            started.add(rid)
        elif name == REQUEST and rid not in closed:
            result.append(OpenRequest(entry, decisions.get(rid), rid in started))
    return result[::-1]


async def find_request(tape: Tape, request_id: str) -> tuple[TapeEntry | None, str | None]:
    """The request entry with `request_id` and how it stands: None (open), or the decision
    stored for it (`approve` / `deny` / `expired`, or `closed`)."""
    found = await tape.query(kinds=["event"], names=NAMES, newest_first=True, limit=200)
    state: str | None = None
    for entry in found:
        data = entry.payload.get("data", {})
        if str(data.get("request", data.get("id", ""))) != request_id:
            continue
        name = entry.payload.get("name")
        if name == REQUEST:
            return entry, state
        if name == DECISION:
            state = str(data.get("decision"))
        elif name == CLOSED and state is None:
            state = "closed"
    return None, None


def is_decision(entry: TapeEntry) -> bool:
    return entry.kind == "event" and entry.payload.get("name") == DECISION
