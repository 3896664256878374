"""The edge of the Slack channel: every request and event is checked here before slack-bolt or
our listeners see it, in HTTP and in Socket Mode alike.

slack-bolt trusts its input: a body that is not a JSON object, a timestamp header that is not a
number, or a field of an unexpected type (`"event": "x"`, `"enterprise": [...]`) raises inside
it (HTTP 500), and a message event with a wrong-typed field reaches the listener. So:

- `verify` checks the signature of an HTTP request on the raw bytes (401 when it fails);
- `read_body` turns the body into a dict (JSON or form), or refuses it (400);
- `clean` reduces the request to the fields the bot uses, each of the type Slack documents
  (slack-bolt gets only that dict), refusing what is unusable.

`Rejected.status` says what an HTTP request gets: 401 (signature), 400 (not something Slack
would send), or 200 for a signed event that is no usable message: acknowledged, so Slack does
not retry it. Reasons name fields, never values (they go to the log).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

from .slack_files import clean_files

MAX_CLOCK_SKEW = 300
"""Seconds a request's timestamp may differ from our clock (Slack's own rule: 5 minutes)."""
MESSAGE_EVENTS = ("message", "app_mention")
ACCEPTED_SUBTYPES = (None, "thread_broadcast", "file_share", "bot_message")
"""Message subtypes that are someone writing to the bot; others (edits, joins) are ignored."""
JSON_TYPE = "application/json"
FORM_TYPE = "application/x-www-form-urlencoded"
MAX_FORM_FIELDS = 64

_ID_RE = re.compile(r"[A-Za-z0-9]{1,64}")
"""Slack ids (T…, C…, D…, U…, B…): they become parts of session ids, so no `:` or spaces."""
_TS_RE = re.compile(r"[0-9]{1,12}\.[0-9]{1,9}")
_TIMESTAMP_RE = re.compile(r"[0-9]{1,12}")
_COMMAND_RE = re.compile(r"/[^\s/]{1,64}")


class Rejected(Exception):
    """A request or event the bot does not use. `kind` names it for the log line."""

    def __init__(self, kind: str, reason: str, status: int = 400) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason
        self.status = status

    @property
    def outcome(self) -> str:
        """The `bub_inbound_messages_total` outcome it counts as."""
        return "unauthorized" if self.status == 401 else "malformed"


# -- HTTP requests -----------------------------------------------------------------------------
def verify(secret: str, headers: Mapping[str, str], body: bytes, now: float | None = None) -> None:
    """Check Slack's `v0` signature of an HTTP request over its raw bytes; raises Rejected(401).

    The timestamp must be ASCII digits within 5 minutes of our clock (slack_sdk's verifier
    raises on a timestamp `int()` cannot read, and works on decoded text only)."""
    timestamp = headers.get("X-Slack-Request-Timestamp") or ""
    signature = headers.get("X-Slack-Signature") or ""
    if not _TIMESTAMP_RE.fullmatch(timestamp):
        raise Rejected("request", "missing or unreadable X-Slack-Request-Timestamp", 401)
    if abs((time.time() if now is None else now) - int(timestamp)) > MAX_CLOCK_SKEW:
        raise Rejected("request", "X-Slack-Request-Timestamp too old or in the future", 401)
    base = b"v0:" + timestamp.encode() + b":" + body
    expected = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    if not secret or not hmac.compare_digest(
        expected.encode(), signature.encode("utf-8", "replace")
    ):
        raise Rejected("request", "missing or wrong X-Slack-Signature", 401)


def is_ssl_check(body: bytes, content_type: str) -> bool:
    """Slack's certificate check of a slash command URL (answered 200, nothing else done)."""
    if content_type != FORM_TYPE or len(body) > 1000:
        return False
    fields = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    return ("ssl_check", "1") in fields


def read_body(body: bytes, content_type: str) -> dict[str, Any]:
    """An HTTP request body as a dict: JSON (events) or a form (slash commands, with the
    interactivity `payload` form field decoded)."""
    if not body:
        raise Rejected("request", "empty body")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise Rejected("request", "body is not UTF-8") from None
    if content_type == JSON_TYPE:
        return _json_object(text, "request")
    if content_type == FORM_TYPE:
        fields = _form(text)
        if "payload" in fields:
            return _json_object(fields["payload"], "interactivity payload")
        return fields
    raise Rejected("request", f"unsupported content type {content_type[:60]!r}")


def _json_object(text: str, kind: str) -> dict[str, Any]:
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise Rejected(kind, "JSON nested too deeply") from None
    except ValueError:
        raise Rejected(kind, "malformed JSON") from None
    if not isinstance(value, dict):
        raise Rejected(kind, "JSON is not an object")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _form(text: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(
            text,
            keep_blank_values=True,
            strict_parsing=True,
            errors="strict",
            max_num_fields=MAX_FORM_FIELDS,
        )
    except ValueError:  # also UnicodeDecodeError: %-escapes that are not UTF-8
        raise Rejected("form", "malformed form body") from None
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise Rejected("form", "a form field given twice")
    return fields


# -- requests and events (HTTP and Socket Mode) ------------------------------------------------
def clean(body: Any) -> dict[str, Any] | None:
    """The request as slack-bolt should see it: only the fields we use, well-typed.

    None for kinds the bot acknowledges and ignores (interactivity, `app_rate_limited`);
    raises Rejected for what is unusable."""
    if not isinstance(body, dict):
        raise Rejected("request", "not a JSON object")
    kind = body.get("type")
    if kind is None and "command" in body:
        return _command(body)
    if not isinstance(kind, str) or not kind:
        raise Rejected("request", "no request type")
    if kind == "url_verification":
        challenge = body.get("challenge")
        if not isinstance(challenge, str) or not challenge or not _unicode(challenge):
            raise Rejected(kind, "challenge is not a string")
        return {"type": kind, "challenge": challenge}
    if kind == "event_callback":
        return _event_callback(body)
    if kind == "block_actions":
        return _block_actions(body)
    return None


_VALUE_RE = re.compile(r"[0-9a-f]{12}:[0-9a-f]{16}")


def _block_actions(body: dict[str, Any]) -> dict[str, Any] | None:
    """A button press: the presser, the conversation, the message and our action. None for
    a press that is not one of the bot's approval buttons (acknowledged, ignored)."""
    kind = "block_actions"

    def field(where: Any, name: str, pattern: re.Pattern[str], optional: bool = False) -> str:
        value = where.get(name) if isinstance(where, dict) else None
        if value is None and optional:
            return ""
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise Rejected(kind, f"{name} is missing or malformed")
        return value

    actions = body.get("actions")
    if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
        raise Rejected(kind, "no actions")
    action = actions[0]
    action_id = action.get("action_id")
    if action_id not in ("bub_approval_approve", "bub_approval_deny"):
        return None
    user = body.get("user")
    container = body.get("container")
    message = body.get("message") if isinstance(body.get("message"), dict) else {}
    name = user.get("name") or user.get("username") if isinstance(user, dict) else ""
    return {
        "type": kind,
        "action": "approve" if action_id == "bub_approval_approve" else "deny",
        "value": field(action, "value", _VALUE_RE),
        "action_ts": field(action, "action_ts", _TS_RE, optional=True),
        "user": field(user, "id", _ID_RE),
        "user_name": name if isinstance(name, str) and _unicode(name) else "",
        "team": field(body.get("team"), "id", _ID_RE, optional=True),
        "channel": field(container, "channel_id", _ID_RE),
        "message_ts": field(container, "message_ts", _TS_RE),
        "thread_ts": field(message, "thread_ts", _TS_RE, optional=True),
    }


def _event_callback(body: dict[str, Any]) -> dict[str, Any]:
    event = body.get("event")
    if not isinstance(event, dict):
        raise Rejected("event_callback", "event is not an object")
    event_type = event.get("type")
    if not isinstance(event_type, str) or not event_type or not _unicode(event_type):
        raise Rejected("event_callback", "event.type is not a string")
    kind = f"event_callback/{event_type[:40]}"
    cleaned: dict[str, Any] = {"type": "event_callback"}
    for key in ("team_id", "event_id", "api_app_id"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not _ID_RE.fullmatch(value):
            raise Rejected(kind, f"{key} is not an id", 200)
        cleaned[key] = value
    if event_type in MESSAGE_EVENTS:
        cleaned["event"] = _message_event(event, kind)
    else:
        cleaned["event"] = {"type": event_type}  # acknowledged by the catch-all listener
    return cleaned


def _message_event(event: dict[str, Any], kind: str) -> dict[str, Any]:
    """A message or app_mention event reduced to what `SlackChannel` reads; raises
    Rejected(200) when one of those fields is missing or of the wrong type."""

    def fail(reason: str) -> Rejected:
        return Rejected(kind, reason, 200)

    cleaned: dict[str, Any] = {"type": event["type"]}
    subtype = event.get("subtype")
    if subtype is not None and not isinstance(subtype, str):
        raise fail("subtype is not a string")
    hidden = event.get("hidden", False)
    if not isinstance(hidden, bool):
        raise fail("hidden is not a boolean")
    cleaned.update(subtype=subtype, hidden=hidden)
    if subtype not in ACCEPTED_SUBTYPES or hidden:
        return cleaned  # an edit, a join, ...: ignored by the listener, nothing else needed
    for key in ("user", "bot_id", "team"):
        value = event.get(key)
        if value is not None and (not isinstance(value, str) or not _ID_RE.fullmatch(value)):
            raise fail(f"{key} is not an id")
        cleaned[key] = value
    if not cleaned["user"] and not cleaned["bot_id"]:
        raise fail("neither user nor bot_id")
    channel = event.get("channel")
    if not isinstance(channel, str) or not _ID_RE.fullmatch(channel):
        raise fail("channel is missing or not an id")
    ts = event.get("ts")
    if not isinstance(ts, str) or not _TS_RE.fullmatch(ts):
        raise fail("ts is missing or not a Slack timestamp")
    thread_ts = event.get("thread_ts")
    if thread_ts is not None and (
        not isinstance(thread_ts, str) or not _TS_RE.fullmatch(thread_ts)
    ):
        raise fail("thread_ts is not a Slack timestamp")
    text = event.get("text")
    if not isinstance(text, str):
        raise fail("text is missing or not a string")
    if not _unicode(text):
        raise fail("text is not valid Unicode")
    cleaned.update(channel=channel, ts=ts, thread_ts=thread_ts or None, text=text)
    for key in ("channel_type", "username"):
        value = event.get(key)
        if value is not None and (not isinstance(value, str) or not _unicode(value)):
            raise fail(f"{key} is not a string")
        cleaned[key] = value
    profile = event.get("user_profile")
    if profile is not None:
        if not isinstance(profile, dict):
            raise fail("user_profile is not an object")
        names = {k: profile.get(k) for k in ("display_name", "real_name")}
        if any(
            v is not None and (not isinstance(v, str) or not _unicode(v)) for v in names.values()
        ):
            raise fail("user_profile names are not strings")
        cleaned["user_profile"] = names
    files = clean_files(event.get("files"))
    if files:
        cleaned["files"] = files
    return cleaned


def _command(body: dict[str, Any]) -> dict[str, Any]:
    """A slash command's fields (a form: every value a string)."""
    kind = "slash_command"
    if not all(isinstance(v, str) and _unicode(v) for v in body.values()):
        raise Rejected(kind, "a field that is not a string")
    if not _COMMAND_RE.fullmatch(body["command"]):
        raise Rejected(kind, "command is not a /command")
    for key in ("user_id", "channel_id"):
        if not _ID_RE.fullmatch(body.get(key) or ""):
            raise Rejected(kind, f"{key} is missing or not an id")
    team = body.get("team_id")
    if team is not None and not _ID_RE.fullmatch(team):
        raise Rejected(kind, "team_id is not an id")
    keep = ("command", "text", "user_id", "user_name", "channel_id", "team_id", "trigger_id")
    cleaned = {k: body[k] for k in (*keep, "response_url", "api_app_id") if k in body}
    cleaned.setdefault("text", "")
    return cleaned


def _unicode(text: str) -> bool:
    """False for strings with lone surrogates (JSON `\\ud800` escapes): no real text has them,
    and they cannot be encoded for the model."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
