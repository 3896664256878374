"""In-process fake of the Telegram Bot API, for tests.

``FakeTelegram`` serves ``/bot<token>/<method>`` and ``/file/bot<token>/<path>`` on 127.0.0.1
(random port). It accepts what aiogram 3 sends (urlencoded or multipart form fields, nested
objects as JSON strings) as well as JSON bodies and query strings, validates like the real API
(HTML entity parsing, UTF-16 length, the General-topic and reply quirks), records every call,
and supports one-shot fault injection. Builder methods produce realistic update dicts.

``enforce_limits()`` turns on Telegram's send limits (messages per second overall, per chat,
per group): past them the fake answers 429 with ``retry_after`` and counts how often the bot
came back before it was told it could (``FloodControl``). Off by default.

Streaming: ``sendMessageDraft`` (private chats only, like the real one) is recorded in
``drafts``, ``deleteMessage`` removes a message; ``call_times`` holds the arrival time
(``time.monotonic()``) of every call in ``calls`` and ``timed(method)`` pairs them up;
``visible(chat_id)`` is what the chat shows now (bot messages after edits and deletions).
Remove ``"sendMessageDraft"`` from ``methods`` for a Bot API without drafts (404).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import math
import re
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Params = dict[str, Any]
Handler = Callable[[Params], Awaitable[Any]]

MAX_TEXT_UTF16 = 4096
# Form values that must stay strings even when they look like JSON ("123", "true", "[x]").
_STRING_FIELDS = frozenset(
    {"text", "caption", "parse_mode", "url", "secret_token", "file_id", "action", "language_code",
     "ip_address", "description", "short_description", "name", "title", "emoji", "query"}
)  # fmt: skip
_ALLOWED_TAGS = frozenset(
    {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "code", "pre", "a",
     "blockquote", "tg-spoiler", "span", "tg-emoji"}
)  # fmt: skip
_TAG_ENTITY = {"b": "bold", "strong": "bold", "i": "italic", "em": "italic", "u": "underline",
               "ins": "underline", "s": "strikethrough", "strike": "strikethrough",
               "del": "strikethrough", "code": "code", "pre": "pre", "a": "text_link",
               "blockquote": "blockquote", "tg-spoiler": "spoiler", "span": "spoiler",
               "tg-emoji": "custom_emoji"}  # fmt: skip
_TAG_RE = re.compile(
    r"<(/?)([A-Za-z][A-Za-z0-9-]*)((?:\s+[^\s=>]+(?:\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s>\"']+))?)*)\s*/?>"
)
_ATTR_RE = re.compile(r"([^\s=>]+)(?:\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s>\"']+)))?")
_HTML_ENTITY_RE = re.compile(r"&(?:lt|gt|amp|quot|#\d+|#x[0-9A-Fa-f]+);")
_AUTO_ENTITY_RE = re.compile(
    r"(?P<cmd>^/[A-Za-z0-9_]+(?:@[A-Za-z0-9_]+)?)|(?P<mention>@[A-Za-z0-9_]{5,32})"
)
CONFLICT = "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
WEBHOOK_ACTIVE = "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are "
    "exactly the same as a current content and reply markup of the message"
)


def utf16_len(text: str) -> int:
    """Length of ``text`` in UTF-16 code units (how Telegram counts lengths and offsets)."""
    return len(text.encode("utf-16-le")) // 2


class ApiError(Exception):
    """Raised by a method handler to answer ``{"ok": false, "error_code": ..., ...}``."""

    def __init__(self, code: int, description: str, parameters: Params | None = None) -> None:
        super().__init__(description)
        self.code, self.description, self.parameters = code, description, parameters

    def payload(self) -> Params:
        """The JSON error body Telegram would send."""
        body: Params = {"ok": False, "error_code": self.code, "description": self.description}
        if self.parameters:
            body["parameters"] = self.parameters
        return body


def parse_html(src: str) -> tuple[str, list[Params]]:
    """Parse Telegram-flavoured HTML into (plain text, entities), raising ApiError(400) like Telegram."""

    def fail(msg: str) -> ApiError:
        return ApiError(400, f"Bad Request: can't parse entities: {msg}")

    out: list[str] = []
    pos = 0  # UTF-16 offset in the output
    stack: list[tuple[str, Params, int]] = []
    entities: list[Params] = []
    i = 0
    while i < len(src):
        ch = src[i]
        if ch == "<":
            off = len(src[:i].encode())
            m = _TAG_RE.match(src, i)
            if not m:
                raise fail(f"Unclosed start tag at byte offset {off}")
            name = m.group(2).lower()
            if m.group(1):
                if not stack:
                    raise fail(f'Unexpected end tag "{name}" at byte offset {off}')
                top, attrs, start = stack.pop()
                if top != name:
                    raise fail(
                        f'Unmatched end tag at byte offset {off}, expected "</{top}>", found "</{name}>"'
                    )
                ent: Params = {"type": _TAG_ENTITY[top], "offset": start, "length": pos - start}
                if top == "a":
                    ent["url"] = attrs.get("href", "")
                elif top == "tg-emoji":
                    ent["custom_emoji_id"] = attrs.get("emoji-id", "")
                elif top == "code" and stack and stack[-1][0] == "pre":
                    lang = attrs.get("class", "")
                    stack[-1][1]["language"] = lang.removeprefix("language-") if lang else None
                    ent = {}
                elif top == "pre" and attrs.get("language"):
                    ent["language"] = attrs["language"]
                if ent and ent["length"] > 0:
                    entities.append(ent)
            else:
                if name not in _ALLOWED_TAGS:
                    raise fail(f'Unsupported start tag "{name}" at byte offset {off}')
                attrs = {
                    a.lower(): b or c or d or "" for a, b, c, d in _ATTR_RE.findall(m.group(3))
                }
                if name == "span" and attrs.get("class") != "tg-spoiler":
                    raise fail(f'Tag "span" must have class "tg-spoiler" at byte offset {off}')
                if name == "a" and "href" not in attrs:
                    raise fail(f'Tag "a" must have attribute "href" at byte offset {off}')
                stack.append((name, {k: html.unescape(v) for k, v in attrs.items()}, pos))
            i = m.end()
            continue
        if ch == "&" and (m := _HTML_ENTITY_RE.match(src, i)):
            ch, i = html.unescape(m.group(0)), m.end() - 1
        out.append(ch)
        pos += utf16_len(ch)
        i += 1
    if stack:
        raise fail(f'Can\'t find end tag corresponding to start tag "{stack[-1][0]}"')
    entities.sort(key=lambda e: (e["offset"], -e["length"]))
    return "".join(out), entities


def _entity(kind: str, text: str, m: re.Match[str]) -> Params:
    """A MessageEntity dict for regex match ``m`` in ``text`` (UTF-16 offset/length)."""
    return {"type": kind, "offset": utf16_len(text[: m.start()]), "length": utf16_len(m.group())}


def _shallow(message: Params) -> Params:
    """A message as embedded in ``reply_to_message`` (Telegram nests only one level)."""
    return {k: v for k, v in message.items() if k != "reply_to_message"}


def _chat_key(chat_id: Any) -> int:
    """A chat id as the limits count it (a ``@username`` counts as one private chat)."""
    try:
        return int(chat_id)
    except (TypeError, ValueError):
        return 0


def _decode(key: str, value: Any) -> Any:
    """Decode one form value: ints, bools and nested objects arrive as JSON strings."""
    if not isinstance(value, str) or key in _STRING_FIELDS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


@dataclass
class Fault:
    """A queued one-shot fault for one API method."""

    code: int = 400
    description: str = "Bad Request: injected failure"
    parameters: Params | None = None
    drop: bool = False
    after_processing: bool = True


Limit = tuple[int, float]
"""At most ``count`` requests in any ``seconds``: (count, seconds)."""
LIMITED_METHODS = frozenset({"sendMessage", "editMessageText", "sendMessageDraft"})


@dataclass
class FloodControl:
    """Telegram's send limits as the fake enforces them, with what happened.

    A request of a limited method is refused with 429 when it would be more than ``count`` in
    any ``seconds`` (the sliding window ends at its arrival) for the whole bot (``overall``),
    for its chat (``chat``), or for its group (``group``, chat ids below zero). The 429 carries
    ``retry_after`` (whole seconds, at least 1, like Telegram): until then its chat (or, for
    the overall limit, every chat) is refused again. Only accepted requests count.
    """

    overall: Limit
    chat: Limit
    group: Limit
    methods: frozenset[str] = LIMITED_METHODS
    accepted: int = 0
    rejected: int = 0
    """429s the limits answered (not counting ``fail_next`` ones)."""
    rejected_by_method: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """The same 429s by method (``sendMessage``, ``sendMessageDraft``, ...)."""
    ignored_retry_after: int = 0
    """Requests to a chat that came before the ``retry_after`` it was told had passed."""
    bot_until: float = 0.0
    chat_until: dict[int, float] = field(default_factory=dict)
    told_until: dict[int, float] = field(default_factory=dict)
    _overall: deque[float] = field(default_factory=deque)
    _chats: dict[int, deque[float]] = field(default_factory=lambda: defaultdict(deque))
    _groups: dict[int, deque[float]] = field(default_factory=lambda: defaultdict(deque))

    def admit(self, chat_id: int, now: float) -> ApiError | None:
        """None when the request may go through (it is counted), else the 429 to answer."""
        if now < self.told_until.get(chat_id, 0.0):
            self.ignored_retry_after += 1
        wait = max(self.bot_until, self.chat_until.get(chat_id, 0.0)) - now
        if wait > 0:
            return self._refuse(chat_id, wait, now)
        over = _window_wait(self._overall, self.overall, now)
        if over > 0:
            self.bot_until = now + math.ceil(over)
            return self._refuse(chat_id, over, now)
        waits = [_window_wait(self._chats[chat_id], self.chat, now)]
        if chat_id < 0:
            waits.append(_window_wait(self._groups[chat_id], self.group, now))
        if max(waits) > 0:
            self.chat_until[chat_id] = now + math.ceil(max(waits))
            return self._refuse(chat_id, max(waits), now)
        self.accepted += 1
        self._overall.append(now)
        self._chats[chat_id].append(now)
        if chat_id < 0:
            self._groups[chat_id].append(now)
        return None

    def told(self, chat_id: int, retry_after: int, now: float) -> None:
        """A 429 with ``retry_after`` went to ``chat_id`` (also a forced one)."""
        self.told_until[chat_id] = max(self.told_until.get(chat_id, 0.0), now + retry_after)
        self.chat_until[chat_id] = max(self.chat_until.get(chat_id, 0.0), now + retry_after)

    def _refuse(self, chat_id: int, wait: float, now: float) -> ApiError:
        retry_after = max(1, math.ceil(wait))
        self.rejected += 1
        self.told_until[chat_id] = max(self.told_until.get(chat_id, 0.0), now + retry_after)
        return ApiError(
            429,
            f"Too Many Requests: retry after {retry_after}",
            {"retry_after": retry_after},
        )


def _window_wait(arrivals: deque[float], limit: Limit, now: float) -> float:
    """Seconds until one more request fits into ``limit`` (0 when it fits now)."""
    count, seconds = limit
    while arrivals and arrivals[0] <= now - seconds:
        arrivals.popleft()
    if len(arrivals) < count:
        return 0.0
    return arrivals[len(arrivals) - count] + seconds - now


@dataclass
class _PollState:
    """getUpdates bookkeeping: pending updates, wake-up event and conflict generation."""

    pending: list[Params] = field(default_factory=list)
    next_id: int = 1
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    generation: int = 0
    conflicts: int = 0


class FakeTelegram:
    """Fake Telegram Bot API server with recording, validation and fault injection."""

    def __init__(
        self, token: str = "123:ABC", username: str = "bub_test_bot", first_name: str = "Bub"
    ) -> None:
        self.token, self.username, self.first_name = token, username, first_name
        self.bot_id = int(token.split(":", 1)[0])
        self.base_url = ""
        self.calls: list[tuple[str, Params]] = []
        self.call_times: list[float] = []
        self.sent: list[Params] = []
        self.edited: list[Params] = []
        self.drafts: list[Params] = []
        self.deleted: list[tuple[int, int]] = []
        self.bot_message_ids: dict[int, list[int]] = defaultdict(list)
        self.files: dict[str, tuple[bytes, str]] = {}
        self.file_downloads: list[str] = []
        """File paths downloaded (``/file/bot<token>/<path>``), in order."""
        self.file_failures = 0
        """Answer the next N file downloads with a 500."""
        self.file_stall: int | None = None
        """Send only this many bytes of a download, then hold it until `file_release` is
        set (a download cut by a crash)."""
        self.file_release = asyncio.Event()
        self.files_sent: list[Params] = []
        """Files the bot posted: {method, message, file_name, data}."""
        self.commands: dict[str, list[Params]] = {}
        self.webhook: Params = {"url": ""}
        self.webhook_last_error: str | None = None
        self.messages: dict[tuple[int, int], Params] = {}  # (chat_id, message_id) -> message
        self.callback_answers: list[Params] = []
        """answerCallbackQuery calls (inline keyboard presses answered)."""
        self._chats: dict[int, Params] = {}
        self._next_mid: dict[int, int] = defaultdict(lambda: 1)
        self._faults: dict[str, deque[Fault]] = defaultdict(deque)
        self._poll = _PollState()
        self._closing = False
        self._runner: web.AppRunner | None = None
        self.limits: FloodControl | None = None
        self.methods: dict[str, Handler] = {
            "getMe": self._get_me,
            "getUpdates": self._get_updates,
            "sendMessage": self._send_message,
            "editMessageText": self._edit_message_text,
            "sendMessageDraft": self._send_message_draft,
            "deleteMessage": self._delete_message,
            "sendChatAction": self._true,
            "setMyCommands": self._set_my_commands,
            "getMyCommands": self._get_my_commands,
            "setWebhook": self._set_webhook,
            "deleteWebhook": self._delete_webhook,
            "getWebhookInfo": self._get_webhook_info,
            "getFile": self._get_file,
            "answerCallbackQuery": self._answer_callback_query,
            "sendDocument": self._send_file,
            "sendPhoto": self._send_file,
        }

    # ---- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> FakeTelegram:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._handle_api)
        app.router.add_get("/file/bot{token}/{file_path:.+}", self._handle_file)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closing = True
        self._wake_pollers()
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- fault injection -------------------------------------------------------------------
    def fail_next(
        self,
        method: str,
        *,
        retry_after: int | None = None,
        description: str | None = None,
        code: int | None = None,
        migrate_to_chat_id: int | None = None,
    ) -> None:
        """Make the next call of ``method`` fail with an error (429 if ``retry_after`` given)."""
        fault = Fault(code or 400, description or Fault.description)
        if retry_after is not None:
            fault.parameters, fault.code = {"retry_after": retry_after}, code or 429
            fault.description = description or f"Too Many Requests: retry after {retry_after}"
        elif migrate_to_chat_id is not None:
            fault.parameters = {"migrate_to_chat_id": migrate_to_chat_id}
            fault.description = (
                description or "Bad Request: group chat was upgraded to a supergroup chat"
            )
        self._faults[method].append(fault)

    def enforce_limits(
        self,
        *,
        overall: Limit = (30, 1.0),
        chat: Limit = (1, 1.0),
        group: Limit = (20, 60.0),
        time_scale: float = 1.0,
        methods: frozenset[str] = LIMITED_METHODS,
    ) -> FloodControl:
        """Refuse sends past Telegram's limits with 429 (see ``FloodControl``).

        ``time_scale=10`` makes every window ten times shorter (30 per 0.1 s, ...), so a test
        runs a minute of traffic in six seconds; ``retry_after`` stays whole seconds."""

        def scaled(limit: Limit) -> Limit:
            return limit[0], limit[1] / time_scale

        self.limits = FloodControl(scaled(overall), scaled(chat), scaled(group), methods)
        return self.limits

    def flood(self, retry_after: int, chat_id: int | None = None) -> None:
        """Start answering 429 now, for ``retry_after`` seconds: in ``chat_id``, or bot-wide.

        Needs ``enforce_limits()``."""
        if self.limits is None:
            raise RuntimeError("flood() needs enforce_limits() first")
        until = time.monotonic() + retry_after
        if chat_id is None:
            self.limits.bot_until = max(self.limits.bot_until, until)
        else:
            self.limits.chat_until[chat_id] = max(self.limits.chat_until.get(chat_id, 0.0), until)

    def drop_next(self, method: str, *, after_processing: bool = True) -> None:
        """Close the connection on the next call of ``method`` without answering.

        ``after_processing=True`` performs the call first (e.g. records the message as sent),
        which makes an ambiguous failure for the client.
        """
        self._faults[method].append(Fault(drop=True, after_processing=after_processing))

    def conflict_next_polls(self, n: int = 1) -> None:
        """Answer the next ``n`` getUpdates calls with 409 Conflict."""
        self._poll.conflicts += n

    # ---- files and inspection --------------------------------------------------------------
    def add_file(self, file_id: str, data: bytes, file_path: str | None = None) -> None:
        """Register bytes served by getFile + ``/file/bot<token>/<file_path>``."""
        self.files[file_id] = (data, file_path or f"documents/{file_id}")

    def file_message(
        self,
        user_id: int,
        kind: str,
        file_id: str,
        data: bytes,
        caption: str | None = None,
        **fields: Any,
    ) -> Params:
        """A private message with a `document`/`audio`/`voice`/`video_note` carrying `data`
        (registered for getFile); `fields` add to the file object (file_name, mime_type,
        duration, file_size to claim another size)."""
        self.add_file(file_id, data, f"{kind}s/{file_id}")
        media: Params = {"file_id": file_id, "file_unique_id": f"u{file_id}"}
        media["file_size"] = len(data)
        if kind in ("voice", "audio", "video_note"):
            media["duration"] = 1
        if kind == "video_note":
            media["length"] = 240
        media.update(fields)
        message: Params = {
            "chat": self._private_chat(user_id, "Ann", None),
            "from": self._user(user_id, "Ann", None),
            kind: media,
        }
        if caption is not None:
            message["caption"] = caption
        return self.message_update(message)

    def sent_to(self, chat_id: int, thread_id: int | None = None) -> list[Params]:
        """Messages the bot sent to ``chat_id`` (and topic ``thread_id`` if given)."""
        in_chat = [m for m in self.sent if m["chat"]["id"] == chat_id]
        return [m for m in in_chat if thread_id is None or m.get("message_thread_id") == thread_id]

    def calls_of(self, method: str) -> list[Params]:
        """Params of every recorded call of ``method``."""
        return [p for name, p in self.calls if name == method]

    def timed(self, *methods: str) -> list[tuple[float, str, Params]]:
        """(arrival time, method, params) of every call of ``methods``, in order."""
        return [
            (t, name, p)
            for t, (name, p) in zip(self.call_times, self.calls, strict=True)
            if name in methods
        ]

    def visible(self, chat_id: int) -> list[str]:
        """The texts of the bot's messages in ``chat_id`` as the chat shows them now."""
        return [
            self.messages[(chat_id, mid)]["text"]
            for mid in self.bot_message_ids[chat_id]
            if (chat_id, mid) in self.messages
        ]

    @property
    def pending_updates(self) -> list[Params]:
        """Updates pushed but not yet confirmed by a getUpdates offset."""
        return list(self._poll.pending)

    # ---- update builders -------------------------------------------------------------------
    def push_update(self, update: Params) -> Params:
        """Queue an update (assigning ``update_id``) and wake held getUpdates requests."""
        update = {**update, "update_id": self._poll.next_id}
        self._poll.next_id += 1
        self._poll.pending.append(update)
        self._wake_pollers()
        return update

    def message_update(self, message: Params) -> Params:
        """Wrap a message dict into an update, filling message_id/date and registering it."""
        message = dict(message)
        chat_id = message["chat"]["id"]
        self._chats.setdefault(chat_id, message["chat"])
        message.setdefault("message_id", self._alloc_mid(chat_id))
        message.setdefault("date", int(time.time()))
        self.messages[(chat_id, message["message_id"])] = message
        return {"message": message}

    def callback_update(
        self, chat_id: int, user_id: int, message_id: int, data: str, first_name: str = "Ann"
    ) -> Params:
        """A press of an inline keyboard button on the bot's message `message_id`."""
        message = self.messages[(chat_id, message_id)]
        user = self._user(user_id, first_name, None)
        query_id = f"q{len(self.callback_answers)}-{message_id}-{user_id}-{time.monotonic_ns()}"
        return {
            "callback_query": {
                "id": query_id,
                "from": user,
                "message": message,
                "chat_instance": str(chat_id),
                "data": data,
            }
        }

    def mention_entities(self, text: str) -> list[Params]:
        """``mention`` entities for each ``@<bot username>`` in ``text`` (UTF-16 offsets)."""
        pattern = re.compile(re.escape(f"@{self.username}"), re.IGNORECASE)
        return [_entity("mention", text, m) for m in pattern.finditer(text)]

    def private_text(
        self,
        user_id: int,
        text: str,
        first_name: str = "Ann",
        username: str | None = None,
        reply_to: int | Params | None = None,
    ) -> Params:
        """A text message from ``user_id`` in their private chat with the bot."""
        user = self._user(user_id, first_name, username)
        chat = self._private_chat(user_id, first_name, username)
        return self._text_update(chat, user, text, None, reply_to, None)

    def group_text(
        self,
        chat_id: int,
        user_id: int,
        text: str,
        entities: list[Params] | None = None,
        reply_to_message: int | Params | None = None,
        thread_id: int | None = None,
        is_forum: bool = False,
        first_name: str = "Ann",
        username: str | None = None,
    ) -> Params:
        """A text message in a group; ``entities=None`` auto-detects mentions and /commands."""
        chat, user = self._group_chat(chat_id, is_forum), self._user(user_id, first_name, username)
        return self._text_update(chat, user, text, entities, reply_to_message, thread_id)

    def photo_message(
        self,
        chat_id: int,
        user_id: int,
        file_id: str,
        sizes: list[tuple[int, int, int]] | None = None,
        caption: str | None = None,
        first_name: str = "Ann",
    ) -> Params:
        """A photo update; the largest (last) size carries ``file_id``, smaller ones ``<id>-<n>``."""
        sizes = sizes or [(90, 68, 1_500), (1280, 960, 120_000)]
        photo = []
        for n, (w, h, s) in enumerate(sizes):
            fid = file_id if n == len(sizes) - 1 else f"{file_id}-{n}"
            photo.append({"file_id": fid, "file_unique_id": f"u{fid}", "width": w, "height": h})
            photo[-1]["file_size"] = s
        chat = self._chat_for(chat_id) if chat_id < 0 else self._private_chat(chat_id, first_name)
        msg: Params = {"chat": chat, "from": self._user(user_id, first_name, None), "photo": photo}
        if caption is not None:
            msg["caption"] = caption
            if ents := self._auto_entities(caption):
                msg["caption_entities"] = ents
        return self.message_update(msg)

    # ---- internals -------------------------------------------------------------------------
    def _alloc_mid(self, chat_id: int) -> int:
        mid = self._next_mid[chat_id]
        self._next_mid[chat_id] = mid + 1
        return mid

    def _wake_pollers(self) -> None:
        self._poll.wake.set()
        self._poll.wake = asyncio.Event()

    @staticmethod
    def _user(user_id: int, first_name: str, username: str | None) -> Params:
        user: Params = {"id": user_id, "is_bot": False, "first_name": first_name}
        if username:
            user["username"] = username
        return user

    def _private_chat(self, user_id: int, first_name: str, username: str | None = None) -> Params:
        chat: Params = {"id": user_id, "type": "private", "first_name": first_name}
        if username:
            chat["username"] = username
        self._chats[user_id] = chat
        return chat

    def _group_chat(self, chat_id: int, is_forum: bool) -> Params:
        supergroup = is_forum or str(chat_id).startswith("-100")
        kind = "supergroup" if supergroup else "group"
        chat = {"id": chat_id, "type": kind, "title": f"Group {chat_id}"}
        if is_forum:
            chat["is_forum"] = True
        self._chats[chat_id] = chat
        return chat

    def _bot_user(self) -> Params:
        user = self._user(self.bot_id, self.first_name, self.username)
        return user | {"is_bot": True}

    @staticmethod
    def _auto_entities(text: str) -> list[Params]:
        kinds = {"cmd": "bot_command", "mention": "mention"}
        return [_entity(kinds[m.lastgroup or ""], text, m) for m in _AUTO_ENTITY_RE.finditer(text)]

    def _text_update(
        self,
        chat: Params,
        user: Params,
        text: str,
        entities: list[Params] | None,
        reply_to: int | Params | None,
        thread_id: int | None,
    ) -> Params:
        msg: Params = {"chat": chat, "from": user, "text": text}
        ents = self._auto_entities(text) if entities is None else entities
        if ents:
            msg["entities"] = ents
        if thread_id is not None:
            msg["message_thread_id"] = thread_id
            if chat.get("is_forum"):
                msg["is_topic_message"] = True
        if isinstance(reply_to, int):
            known = self.messages.get((chat["id"], reply_to))
            reply_to = known or {"message_id": reply_to, "date": int(time.time()), "chat": chat}
        if reply_to is not None:
            msg["reply_to_message"] = _shallow(reply_to)
        return self.message_update(msg)

    def _chat_for(self, chat_id: Any) -> Params:
        try:
            cid = int(chat_id)
        except (TypeError, ValueError):
            raise ApiError(400, "Bad Request: chat not found") from None
        if cid in self._chats:
            return self._chats[cid]
        if cid > 0:
            return self._private_chat(cid, "Ann")
        return self._group_chat(cid, False)

    def _render(self, p: Params) -> tuple[str, list[Params]]:
        """Validate and parse ``text`` like Telegram: returns stripped plain text and entities."""
        raw = p.get("text")
        if raw is None or raw == "":
            raise ApiError(400, "Bad Request: message text is empty")
        mode = str(p.get("parse_mode") or "").lower()
        text, ents = parse_html(str(raw)) if mode == "html" else (str(raw), p.get("entities") or [])
        stripped = text.lstrip()
        lead, text = utf16_len(text) - utf16_len(stripped), stripped.rstrip()
        if not text:
            raise ApiError(400, "Bad Request: message text is empty")
        if utf16_len(text) > MAX_TEXT_UTF16:
            raise ApiError(400, "Bad Request: message is too long")
        size, shifted = utf16_len(text), []
        for e in ents:
            start, end = max(e["offset"] - lead, 0), min(e["offset"] + e["length"] - lead, size)
            if end > start:
                shifted.append({**e, "offset": start, "length": end - start})
        return text, shifted

    # ---- HTTP ------------------------------------------------------------------------------
    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return web.json_response(ApiError(401, "Unauthorized").payload(), status=401)
        name = request.match_info["method"]
        method = next((m for m in self.methods if m.lower() == name.lower()), None)
        if method is None:
            return web.json_response(ApiError(404, "Not Found").payload(), status=404)
        raw: Params = dict(request.query)
        if request.content_type == "application/json":
            raw.update(await request.json())
        elif request.can_read_body:
            form = await request.post()
            raw.update({k: v for k, v in form.items() if isinstance(v, str)})
            uploads = {k: v for k, v in form.items() if isinstance(v, web.FileField)}
            for key, value in list(raw.items()):
                if isinstance(value, str) and value.startswith("attach://"):
                    upload = uploads.get(value.removeprefix("attach://"))
                    if upload is not None:
                        raw[key] = {"file_name": upload.filename, "data": upload.file.read()}
            for key, upload in uploads.items():
                if key in ("document", "photo"):
                    raw[key] = {"file_name": upload.filename, "data": upload.file.read()}
        params = {k: _decode(k, v) for k, v in raw.items()}
        self.calls.append((method, params))
        self.call_times.append(time.monotonic())
        fault = self._faults[method].popleft() if self._faults[method] else None
        if fault and fault.drop and not fault.after_processing:
            return self._drop(request)
        if self.limits is not None and method in self.limits.methods:
            chat_id, now = _chat_key(params.get("chat_id")), time.monotonic()
            retry_after = (fault.parameters or {}).get("retry_after") if fault else None
            if retry_after is not None:
                self.limits.told(chat_id, int(retry_after), now)
            elif not (fault and not fault.drop) and (refusal := self.limits.admit(chat_id, now)):
                self.limits.rejected_by_method[method] += 1
                return web.json_response(refusal.payload(), status=429)
        if fault and not fault.drop:
            err = ApiError(fault.code, fault.description, fault.parameters)
            return web.json_response(err.payload(), status=fault.code)
        try:
            body: Params = {"ok": True, "result": await self.methods[method](params)}
            status = 200
        except ApiError as e:
            body, status = e.payload(), e.code
        if fault and fault.drop:
            return self._drop(request)
        return web.json_response(body, status=status)

    @staticmethod
    def _drop(request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError  # aiohttp gives up on the request; the client sees a disconnect

    async def _stalled(self, request: web.Request, data: bytes, cut: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(len(data))})
        resp.content_type = "application/octet-stream"
        await resp.prepare(request)
        await resp.write(data[:cut])
        await self.file_release.wait()
        await resp.write(data[cut:])
        await resp.write_eof()
        return resp

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return web.json_response(ApiError(401, "Unauthorized").payload(), status=401)
        path = request.match_info["file_path"]
        self.file_downloads.append(path)
        if self.file_failures > 0:
            self.file_failures -= 1
            return web.json_response(ApiError(500, "Internal Server Error").payload(), status=500)
        for data, file_path in self.files.values():
            if file_path == path:
                if self.file_stall is not None:
                    return await self._stalled(request, data, self.file_stall)
                return web.Response(body=data, content_type="application/octet-stream")
        return web.json_response(ApiError(404, "Not Found").payload(), status=404)

    # ---- methods ---------------------------------------------------------------------------
    async def _true(self, p: Params) -> bool:
        return True

    async def _answer_callback_query(self, p: Params) -> bool:
        if not p.get("callback_query_id"):
            raise ApiError(400, "Bad Request: query is too old or query ID is invalid")
        self.callback_answers.append(dict(p))
        return True

    async def _get_me(self, p: Params) -> Params:
        flags = ("can_join_groups", "can_read_all_group_messages", "supports_inline_queries")
        return self._bot_user() | dict.fromkeys(flags, False) | {"can_join_groups": True}

    async def _get_updates(self, p: Params) -> list[Params]:
        poll = self._poll
        if poll.conflicts > 0:
            poll.conflicts -= 1
            raise ApiError(409, CONFLICT)
        if self.webhook.get("url"):
            raise ApiError(409, WEBHOOK_ACTIVE)
        offset, limit = int(p.get("offset") or 0), max(1, min(int(p.get("limit") or 100), 100))
        if offset > 0:
            poll.pending = [u for u in poll.pending if u["update_id"] >= offset]
        elif offset < 0:
            poll.pending = poll.pending[offset:]
        poll.generation += 1
        generation = poll.generation
        self._wake_pollers()  # a newer poll terminates an older held one
        deadline = time.monotonic() + float(p.get("timeout") or 0)
        while not poll.pending and not self._closing and (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(poll.wake.wait(), left)
            if poll.generation != generation:
                raise ApiError(409, CONFLICT)
        return poll.pending[:limit]

    async def _send_message(self, p: Params) -> Params:
        chat = self._chat_for(p.get("chat_id"))
        text, ents = self._render(p)
        thread_id = p.get("message_thread_id")
        if thread_id is not None and int(thread_id) == 1:
            raise ApiError(400, "Bad Request: message thread not found")
        reply = p.get("reply_parameters") or {}
        if p.get("reply_to_message_id") is not None:
            reply = {"message_id": p["reply_to_message_id"]}
            reply["allow_sending_without_reply"] = p.get("allow_sending_without_reply")
        msg: Params = {"message_id": 0, "from": self._bot_user(), "chat": chat}
        msg["date"] = int(time.time())
        if thread_id is not None:
            msg["message_thread_id"] = int(thread_id)
            if chat.get("is_forum"):
                msg["is_topic_message"] = True
        if reply.get("message_id") is not None:
            key = (int(reply.get("chat_id") or chat["id"]), int(reply["message_id"]))
            if (target := self.messages.get(key)) is not None:
                msg["reply_to_message"] = _shallow(target)
            elif not reply.get("allow_sending_without_reply"):
                raise ApiError(400, "Bad Request: message to be replied not found")
        msg["message_id"] = self._alloc_mid(chat["id"])
        msg["text"] = text
        if ents:
            msg["entities"] = ents
        markup = p.get("reply_markup")
        if isinstance(markup, dict) and "inline_keyboard" in markup:
            msg["reply_markup"] = markup
        self.messages[(chat["id"], msg["message_id"])] = msg
        self.bot_message_ids[chat["id"]].append(msg["message_id"])
        self.sent.append(msg)
        return msg

    async def _send_file(self, p: Params) -> Params:
        """sendDocument / sendPhoto with an uploaded file: recorded in ``files_sent``."""
        chat = self._chat_for(p.get("chat_id"))
        kind = "photo" if "photo" in p else "document"
        upload = p.get(kind)
        if not isinstance(upload, dict) or not upload.get("data"):
            raise ApiError(400, f"Bad Request: there is no {kind} in the request")
        caption = p.get("caption")
        if caption is not None and len(str(caption)) > 1024:
            raise ApiError(400, "Bad Request: message caption is too long")
        msg: Params = {"message_id": self._alloc_mid(chat["id"]), "from": self._bot_user()}
        msg |= {"chat": chat, "date": int(time.time())}
        if p.get("message_thread_id") is not None:
            msg["message_thread_id"] = int(p["message_thread_id"])
        if caption is not None:
            msg["caption"] = caption
        file_id = f"sent-{msg['message_id']}"
        if kind == "photo":
            msg["photo"] = [
                {"file_id": file_id, "file_unique_id": file_id, "width": 1, "height": 1}
            ]
        else:
            msg["document"] = {"file_id": file_id, "file_unique_id": file_id,
                               "file_name": upload["file_name"]}  # fmt: skip
        self.messages[(chat["id"], msg["message_id"])] = msg
        self.files_sent.append({"method": kind, "message": msg, **upload})
        return msg

    async def _edit_message_text(self, p: Params) -> Params:
        key = (int(p.get("chat_id") or 0), int(p.get("message_id") or 0))
        msg = self.messages.get(key)
        if msg is None:
            raise ApiError(400, "Bad Request: message to edit not found")
        if msg.get("from", {}).get("id") != self.bot_id:
            raise ApiError(400, "Bad Request: message can't be edited")
        text, ents = self._render(p)
        if text == msg.get("text") and ents == msg.get("entities", []):
            raise ApiError(400, NOT_MODIFIED)
        new = {k: v for k, v in msg.items() if k not in ("entities", "reply_markup")}
        new.update(text=text, edit_date=int(time.time()))
        if p.get("reply_markup"):
            new["reply_markup"] = _decode("reply_markup", p["reply_markup"])
        if ents:
            new["entities"] = ents
        self.messages[key] = new
        self.edited.append(new)
        return new

    async def _send_message_draft(self, p: Params) -> bool:
        chat_id = int(p.get("chat_id") or 0)
        if chat_id <= 0:
            raise ApiError(400, "Bad Request: drafts can be sent only to private chats")
        if not int(p.get("draft_id") or 0):
            raise ApiError(400, "Bad Request: draft_id must be non-zero")
        text, ents = ("", []) if not p.get("text") else self._render(p)
        self.drafts.append({**p, "text": text, "entities": ents, "time": time.monotonic()})
        return True

    async def _delete_message(self, p: Params) -> bool:
        key = (int(p.get("chat_id") or 0), int(p.get("message_id") or 0))
        if key not in self.messages:
            raise ApiError(400, "Bad Request: message to delete not found")
        del self.messages[key]
        self.deleted.append(key)
        return True

    @staticmethod
    def commands_key(p: Params) -> str:
        """Key of ``tg.commands``: JSON of [scope or {"type": "default"}, language_code or ""]."""
        return json.dumps([p.get("scope") or {"type": "default"}, p.get("language_code") or ""])

    async def _set_my_commands(self, p: Params) -> bool:
        self.commands[self.commands_key(p)] = list(p.get("commands") or [])
        return True

    async def _get_my_commands(self, p: Params) -> list[Params]:
        return self.commands.get(self.commands_key(p), [])

    async def _set_webhook(self, p: Params) -> bool:
        if p.get("drop_pending_updates"):
            self._poll.pending.clear()
        keys = ("url", "secret_token", "allowed_updates", "drop_pending_updates")
        self.webhook = {k: p.get(k) for k in keys}
        return True

    async def _delete_webhook(self, p: Params) -> bool:
        if p.get("drop_pending_updates"):
            self._poll.pending.clear()
        self.webhook = {"url": "", "drop_pending_updates": bool(p.get("drop_pending_updates"))}
        return True

    async def _get_webhook_info(self, p: Params) -> Params:
        info: Params = {"url": self.webhook.get("url") or "", "has_custom_certificate": False}
        info["pending_update_count"] = len(self._poll.pending)
        if self.webhook.get("allowed_updates"):
            info["allowed_updates"] = self.webhook["allowed_updates"]
        if self.webhook_last_error:
            info["last_error_date"] = int(time.time())
            info["last_error_message"] = self.webhook_last_error
        return info

    async def _get_file(self, p: Params) -> Params:
        file_id = str(p.get("file_id") or "")
        if file_id not in self.files:
            raise ApiError(400, "Bad Request: invalid file_id")
        data, path = self.files[file_id]
        return {"file_id": file_id, "file_unique_id": f"u{file_id}", "file_size": len(data)} | {
            "file_path": path
        }
