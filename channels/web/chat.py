"""The chat's HTTP side: the page, the conversation list, posting a message, the event stream.

Event stream (Server-Sent Events, `GET /api/conversations/<id>/events`):

- `sync`     `{cursor, items, truncated}`: the conversation since its last anchor; the page
             replaces what it shows (first connect, and after a /reset cleared the tape).
- `entries`  `{cursor, items}`: new items after the page's cursor (the SSE id is the cursor,
             so a reconnecting browser sends it back as Last-Event-ID and misses nothing).
- `working`  `{working}`: a turn is running in this conversation (the working indicator).
- `partial`  `{html, status}`: the answer still being written (streaming, `stream.py`):
             `html` its text so far, rendered like the final answer; or `status`, what the
             bot is doing ("using fs.read…"); both empty: take the partial answer away.
             Only the newest state is sent (a slow page skips states); a page connecting
             mid-answer gets the current one. The final `entries` item (`answer: true`)
             replaces it.

Items are `{id, date, kind: user|bot|notice|anchor, html, client_id?, answer?}`; `html` is
rendered on the server (Markdown without raw HTML), so the page never turns model text into
markup.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from html import escape
from typing import Any

from aiohttp import web

from bub_bot.config import MODEL_MISSING, Settings
from bub_bot.tape import Tape, TapeStore
from channels.base import (
    CLICK_ALREADY,
    CLICK_APPROVED,
    CLICK_DENIED,
    CLICK_EXPIRED,
    CLICK_NOT_ALLOWED,
    ApprovalClick,
    Inbound,
    Sender,
    click_note,
)

from .attempts import client_key
from .auth import secure
from .history import Cursor, snapshot, tail
from .hub import Hub, Subscription
from .relay import Relay
from .render import attrs, page
from .runtime import WebRuntime
from .uploads import Uploads

log = logging.getLogger("channels.web")

CONVERSATION_RE = re.compile(r"[A-Za-z0-9_-]{6,64}")
CLIENT_ID_RE = re.compile(r"[A-Za-z0-9_-]{8,64}")
MAX_TEXT = 100_000
KEEPALIVE_SECONDS = 15.0
COALESCE_SECONDS = 0.002
"""How long an event stream waits after a wake-up for more of the same moment's news."""
LIST_LIMIT = 100
COMMANDS_HINT = (
    "Commands: /handoff [summary], /reset, /status, /anchors, /tools, /skills, /schedules,"
    " /unschedule <id>, /usage [all], /stop [id], /help"
)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _summary(
    store: TapeStore, tape: str, session_id: str, updated: str, entries: int
) -> dict[str, Any]:
    """A conversation's row of the list, titled by its first message (not a summary)."""
    users = await store.query(tape, kinds=["message"], names=["user"], limit=5)
    first = next((e for e in users if e.meta.get("inbound")), None)
    title = ""
    if first is not None:
        content = first.payload.get("content")
        title = content if isinstance(content, str) else "(image)"
    return {
        "id": session_id[len("web:") :],
        "title": " ".join(title.split())[:80] or "(no messages since /reset)",
        "updated": updated,
        "entries": entries,
    }


def _sse(event: str, data: dict[str, Any], event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    body = f"{head}event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
    return body.encode("utf-8", "replace")  # a lone surrogate must not end the stream


class ChatRoutes:
    """Handlers of the chat page and its JSON/SSE API."""

    def __init__(
        self,
        settings: Settings,
        hub: Hub,
        relay: Relay,
        runtime: Callable[[], WebRuntime],
        *,
        channel: str = "web",
    ) -> None:
        self.settings = settings
        self.hub = hub
        self.relay = relay
        self.runtime = runtime
        """The runtime, once started (else it raises 503: `WebChannel.require_runtime`)."""
        self.channel = channel
        """The channel's name: inbound messages are this channel's."""
        self.uploads = Uploads(settings)
        """Files uploaded with messages, staged until the turn fetches them."""
        self.streams: dict[str, int] = {}
        """Open event streams per client address (BUB_WEB_MAX_STREAMS_PER_CLIENT)."""

    # -- helpers -------------------------------------------------------------------------------
    async def _tape(self, conversation: str) -> Tape:
        """The conversation's tape, where the runtime keeps it (BUB_WORKSPACE_MAP may give
        each conversation a workspace, and so a tape, of its own)."""
        return await self.runtime().session_tape(f"web:{conversation}")

    @staticmethod
    def _conversation(request: web.Request) -> str | None:
        conversation = request.match_info["conversation"]
        return conversation if CONVERSATION_RE.fullmatch(conversation) else None

    # -- page ------------------------------------------------------------------------------------
    async def page(self, request: web.Request) -> web.StreamResponse:
        settings = self.settings
        banner = ""
        if not settings.model_configured:
            banner = (
                f'<div class="banner" id="model-missing" role="alert">{escape(MODEL_MISSING)}</div>'
            )
        viewer = (
            '<a class="viewer-link" href="/tapes">Tape viewer</a>' if settings.web_viewer else ""
        )
        body = (
            '<div class="app"><aside class="sidebar">'
            '<button type="button" id="new-conversation">New conversation</button>'
            '<nav id="conversations" aria-label="Conversations"></nav>'
            f"{viewer}</aside>"
            f'<main class="chat">{banner}'
            '<div id="status" class="status" hidden></div>'
            '<div id="messages" class="messages" aria-live="polite"></div>'
            '<div id="working" class="working" hidden>bub is working…</div>'
            '<form id="composer" class="composer" autocomplete="off">'
            '<textarea id="text" name="text" rows="2" placeholder="Message bub (Enter sends,'
            ' Shift+Enter for a new line)"></textarea>'
            '<label class="attach" title="Attach files (or drop them here)">&#128206;'
            '<input type="file" id="files" multiple hidden></label>'
            '<button type="submit" id="send">Send</button>'
            '<div id="attached" class="attached" hidden></div></form>'
            f'<p class="hint">{escape(COMMANDS_HINT)}</p></main></div>'
        )
        model = "ok" if settings.model_configured else "missing"
        html = page("bub-bot", body, body_attrs=attrs(data_model=model), scripts=("chat.js",))
        return web.Response(text=html, content_type="text/html")

    # -- conversations -----------------------------------------------------------------------
    async def list_conversations(self, request: web.Request) -> web.StreamResponse:
        """Web conversations, most recently active first, with a title from the first message."""
        runtime = self.runtime()
        store = runtime.store
        rows = []
        for row in await store.list_tapes():
            session = row.session_id or ""
            if not session.startswith("web:"):
                continue
            if row.name != (await runtime.session_tape(session)).name:
                continue  # an old tape of the session (e.g. from before BUB_WORKSPACE changed)
            rows.append(row)
            if len(rows) >= LIST_LIMIT:
                break
        found = [
            await _summary(store, row.name, row.session_id, row.updated, row.entries)
            for row in rows
        ]
        return web.json_response(
            {"conversations": found, "model_configured": self.settings.model_configured}
        )

    async def one_conversation(self, request: web.Request) -> web.StreamResponse:
        """One conversation's row of the list, as `list_conversations` gives it: what the page
        reads after new entries (only this conversation changed), instead of the whole list.
        404 while its tape holds nothing."""
        conversation = self._conversation(request)
        if conversation is None:
            return _error(404, "no such conversation")
        tape = await self._tape(conversation)
        newest = await tape.store.query(tape.name, newest_first=True, limit=1)
        if not newest:
            return _error(404, "no such conversation")
        session = f"web:{conversation}"
        row = await _summary(tape.store, tape.name, session, newest[0].date, newest[0].id)
        return web.json_response(row)

    async def new_conversation(self, request: web.Request) -> web.StreamResponse:
        """A fresh conversation id (its tape starts with the first message)."""
        return web.json_response({"id": secrets.token_urlsafe(12)}, status=201)

    # -- messages ----------------------------------------------------------------------------
    async def upload_file(self, request: web.Request) -> web.StreamResponse:
        """Stage a file for a message of this conversation (see uploads.py)."""
        conversation = self._conversation(request)
        if conversation is None:
            return _error(404, "no such conversation")
        return await self.uploads.receive(request, conversation)

    async def post_message(self, request: web.Request) -> web.StreamResponse:
        """Store a message (or command) durably, then acknowledge; the answer comes as an event.

        The same `client_id` twice (a retried request) is stored and answered once."""
        conversation = self._conversation(request)
        if conversation is None:
            return _error(404, "no such conversation")
        if request.content_type != "application/json":
            return _error(415, 'send JSON: {"text": ..., "client_id": ...}')
        try:
            body = await request.json()
        except ValueError:  # also bytes that are not text in the body's charset
            return _error(400, "the body is not valid JSON")
        except LookupError:
            return _error(400, "unknown charset in Content-Type (send UTF-8 JSON)")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        text, client_id = body.get("text"), body.get("client_id")
        files = self.uploads.attachments(conversation, body.get("files"))
        if isinstance(files, str):
            return _error(400, files)
        if not isinstance(text, str) or not (text.strip() or files):
            return _error(400, "text is missing or empty")
        if len(text) > MAX_TEXT:
            return _error(413, f"text is longer than {MAX_TEXT} characters")
        if not isinstance(client_id, str) or not CLIENT_ID_RE.fullmatch(client_id):
            return _error(400, "client_id must be 8-64 characters of A-Za-z0-9_-")
        runtime = self.runtime()
        inbound = Inbound(
            channel=self.channel,
            session_id=f"web:{conversation}",
            delivery_key=f"{conversation}:{client_id}",
            message_id=client_id,
            sender=Sender(id="web", name="web user"),
            text=text,
            reply_target={"conversation": conversation},
            attachments=tuple(files),
        )
        try:
            received = await runtime.receive(inbound)
        except Exception as exc:
            log.error("web.receive failed session=web:%s: %s", conversation, exc)
            return _error(503, "the message could not be stored; please send it again")
        self.hub.notify(conversation)
        if received.new:
            await self.relay.changed(conversation)  # pages on other replicas
        return web.json_response(
            {"stored": True, "duplicate": received.duplicate, "entry_id": received.entry_id},
            status=202 if received.new else 200,
        )

    async def decide(self, request: web.Request) -> web.StreamResponse:
        """A press of an approval request's button: `{"decision": "approve"|"deny",
        "digest": ...}`; stored before the answer. 202: decided; 409: decided before or
        expired; 403: this person may not decide; 404: no such request (or a digest that
        does not match): nothing runs."""
        conversation = self._conversation(request)
        request_id = request.match_info.get("request", "")
        if conversation is None or not re.fullmatch(r"[0-9a-f]{12}", request_id):
            return _error(404, "no such request")
        try:
            body = await request.json()
        except (ValueError, LookupError):
            return _error(400, "the body is not valid JSON")
        if not isinstance(body, dict) or body.get("decision") not in ("approve", "deny"):
            return _error(400, 'send {"decision": "approve" or "deny", "digest": ...}')
        digest = body.get("digest")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{16}", digest):
            return _error(400, "digest is missing or malformed")
        outcome = await self.runtime().decide(
            ApprovalClick(
                channel=self.channel,
                session_id=f"web:{conversation}",
                request_id=request_id,
                digest=digest,
                decision=body["decision"],
                user=Sender(id="web", name="web user"),
            )
        )
        self.hub.notify(conversation)
        status = {
            CLICK_APPROVED: 202,
            CLICK_DENIED: 202,
            CLICK_ALREADY: 409,
            CLICK_EXPIRED: 409,
            CLICK_NOT_ALLOWED: 403,
        }.get(outcome, 404)
        if status == 202:
            await self.relay.changed(conversation)
        return web.json_response({"outcome": outcome, "note": click_note(outcome)}, status=status)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """JSON: the conversation since its last anchor, or what came after `?after=<cursor>`;
        with the answer being written, if any (`partial`, as the event stream's)."""
        conversation = self._conversation(request)
        if conversation is None:
            return _error(404, "no such conversation")
        store = self.runtime().store
        name = (await self._tape(conversation)).name
        cursor = Cursor.parse(request.query.get("after"))
        if cursor is None:
            snap = await snapshot(store, name)
            reset, items, cursor, truncated = False, snap.items, snap.cursor, snap.truncated
        else:
            cursor, items, fresh = await tail(store, name, cursor)
            reset, truncated = fresh is not None, bool(fresh and fresh.truncated)
        partial = self.hub.partial(conversation)
        return web.json_response(
            {
                "cursor": str(cursor),
                "reset": reset,
                "items": items,
                "truncated": truncated,
                "working": self.hub.busy(conversation),
                "partial": partial.payload() if partial is not None else None,
            }
        )

    async def events(self, request: web.Request) -> web.StreamResponse:
        """The conversation as Server-Sent Events (see the module docstring)."""
        conversation = self._conversation(request)
        if conversation is None:
            return _error(404, "no such conversation")
        client = client_key(request)
        if self.streams.get(client, 0) >= self.settings.web_max_streams_per_client:
            # Each stream holds a connection for good: one client must not hold them all.
            return _error(
                429,
                f"too many open event streams from this client"
                f" (BUB_WEB_MAX_STREAMS_PER_CLIENT={self.settings.web_max_streams_per_client})",
            )
        self.streams[client] = self.streams.get(client, 0) + 1
        try:
            return await self._events(request, conversation)
        finally:
            left = self.streams.get(client, 1) - 1
            if left > 0:
                self.streams[client] = left
            else:
                self.streams.pop(client, None)

    async def _events(self, request: web.Request, conversation: str) -> web.StreamResponse:
        store = self.runtime().store
        name = (await self._tape(conversation)).name
        hub = self.hub
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "X-Accel-Buffering": "no",  # nginx: do not buffer the stream
            }
        )
        secure(response)
        await response.prepare(request)
        cursor = Cursor.parse(request.headers.get("Last-Event-ID") or request.query.get("after"))
        try:
            await response.write(b"retry: 2000\n\n")
            with hub.subscribe(conversation) as sub:
                if cursor is None:
                    snap = await snapshot(store, name)
                    cursor = snap.cursor
                    new = _sync(snap)
                else:
                    cursor, new = await _new_entries(store, name, cursor)
                working = hub.busy(conversation)
                opening = [new, _sse("working", {"working": working}), _partial_event(hub, sub)]
                await response.write(b"".join(opening))
                while not hub.closed:
                    idle = False
                    try:
                        async with asyncio.timeout(KEEPALIVE_SECONDS):
                            await sub.wake.wait()
                    except TimeoutError:
                        # Keeps proxies from closing an idle stream, finds a gone client, and
                        # picks up writes nobody told this process about (a lost broadcast).
                        idle = True
                    else:
                        # What happens in the same moment (an answer stored, its partial taken
                        # away, the turn ending) goes out as one write, not one per wake-up.
                        await asyncio.sleep(COALESCE_SECONDS)
                    sub.wake.clear()
                    if hub.closed:
                        break
                    out = [b": keepalive\n\n"] if idle else []
                    if sub.changed or idle:
                        sub.changed = False
                        cursor, new = await _new_entries(store, name, cursor)
                        out.append(new)
                    # After the entries: a final answer replaces its partial without a gap.
                    out.append(_partial_event(hub, sub))
                    now = hub.busy(conversation)
                    if now != working:
                        working = now
                        out.append(_sse("working", {"working": working}))
                    data = b"".join(out)
                    if data:
                        await response.write(data)
        except (ConnectionResetError, ConnectionError):
            pass  # the page went away
        return response


async def _new_entries(store: Any, name: str, cursor: Cursor) -> tuple[Cursor, bytes]:
    """The entries after `cursor` as an `entries` event (a `sync` after a reset), b"" when
    there are none; with the new cursor."""
    new_cursor, items, fresh = await tail(store, name, cursor)
    if fresh is not None:
        return new_cursor, _sync(fresh)
    if items or new_cursor != cursor:
        data = {"cursor": str(new_cursor), "items": items}
        return new_cursor, _sse("entries", data, str(new_cursor))
    return new_cursor, b""


def _partial_event(hub: Hub, sub: Subscription) -> bytes:
    """The newest state of the answer being written, if this page has not had it yet (b""
    if it has). Its cost (rendering, encoding) is charged to the hub's partial budget."""
    partial, sub.partial = sub.partial, None
    if partial is None:
        return b""
    started = time.perf_counter()
    data = _sse("partial", partial.payload())
    hub.charge(time.perf_counter() - started)
    return data


def _sync(snap: Any) -> bytes:
    data = {"cursor": str(snap.cursor), "items": snap.items, "truncated": snap.truncated}
    return _sse("sync", data, str(snap.cursor))
