"""In-process fake of the Slack Web API and Socket Mode, for tests.

``FakeSlack`` serves ``POST /api/<method>`` and a Socket Mode websocket at ``/socket``
on 127.0.0.1 (random port), records every call, and supports one-shot fault injection.
The module-level payload builders produce dicts shaped like what Slack sends.

Streaming: ``chat.startStream`` / ``chat.appendStream`` / ``chat.stopStream`` build a message
from its ``markdown_text`` (a thread is required; outside DMs so are the recipient user and
team), ``chat.update`` refuses a message still streaming, ``chat.delete`` removes one.
``streaming_enabled = False`` answers the stream methods with ``streaming_error`` (a
workspace or token that cannot stream). ``visible(channel, thread_ts)`` is what a thread shows
now (the bot's messages after updates and deletions).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import WSMsgType, web

Params = dict[str, Any]
Handler = Callable[[Params], Awaitable[Params]]

DEFAULT_TEAM_ID = "T1"
DEFAULT_BOT_USER_ID = "UBOT"
DEFAULT_APP_ID = "A1"
VERIFICATION_TOKEN = "verification-token"
MAX_TEXT_LEN = 40000
_event_seq: Iterator[int] = itertools.count(1)


class SlackError(Exception):
    """Raised by a method handler to answer ``{"ok": false, "error": <code>}``."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class Fault:
    """A queued one-shot fault for one API method."""

    status: int = 200
    error: str | None = None
    retry_after: int | None = None
    drop: bool = False
    after_processing: bool = True
    passthrough: bool = False
    """A placeholder: the call is answered normally (lets a fault hit the n-th call)."""


class FakeSlack:
    """Fake Slack server: Web API + Socket Mode, with recording and fault injection."""

    def __init__(
        self,
        bot_token: str = "xoxb-test",
        app_token: str = "xapp-test",
        team_id: str = DEFAULT_TEAM_ID,
        bot_user_id: str = DEFAULT_BOT_USER_ID,
        bot_id: str = "BBOT",
        app_id: str = DEFAULT_APP_ID,
    ) -> None:
        self.bot_token, self.app_token = bot_token, app_token
        self.team_id, self.bot_user_id, self.bot_id = team_id, bot_user_id, bot_id
        self.app_id = app_id
        self.assistant_enabled = True
        self.assistant_error = "not_allowed_token_type"
        self.streaming_enabled = True
        self.streaming_error = "unknown_method"
        self.deleted: list[tuple[str, str]] = []
        self.calls: list[tuple[str, Params]] = []
        self.call_times: list[float] = []
        """When each of ``calls`` arrived (``time.monotonic()``), for checks on pacing."""
        self.posts: list[Params] = []
        self.ephemerals: list[Params] = []
        self.updates: list[Params] = []
        self.statuses: list[Params] = []
        self.reactions: set[tuple[str, str, str]] = set()
        self.messages: dict[tuple[str, str], Params] = {}
        self.responses: list[tuple[str, Any]] = []
        self.acks: list[str] = []
        self.ack_messages: dict[str, Params] = {}
        self.users: dict[str, Params] = {}
        self.channels: dict[str, Params] = {}
        self.files: dict[str, tuple[bytes, Params]] = {}
        """File id -> (bytes, file object) served at ``/files-pri/<team>-<id>/download/<name>``
        with the bot token as a bearer (``add_file``); ``files.info`` answers the object."""
        self.file_downloads: list[tuple[str, str | None]] = []
        """(file id, Authorization header) of every download attempt."""
        self.file_failures = 0
        """Answer the next N downloads with a 500."""
        self.threads: dict[tuple[str, str], list[Params]] = defaultdict(list)
        """(channel, thread_ts) -> the thread's messages, root first, for
        ``conversations.replies`` (paged by ``limit`` with a ``next_cursor``); the bot's own posts
        in a thread are answered with them (their ``metadata`` with
        ``include_all_metadata``), as ``conversations.history`` answers the top level."""
        self.uploads: list[Params] = []
        """Files the bot posted (external upload, completed): filename, data, channel_id,
        thread_ts, initial_comment."""
        self._pending_uploads: dict[str, Params] = {}
        self.files_scope = True
        """False: the bot token lacks `files:read` (downloads get the sign-in page)."""
        self._faults: dict[str, deque[Fault]] = defaultdict(deque)
        self._tickets: set[str] = set()
        self._sockets: set[web.WebSocketResponse] = set()
        self._last_ts = 0
        self._changed = asyncio.Condition()
        self._connected = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._handlers: dict[str, Handler] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._post_message,
            "chat.postEphemeral": self._post_ephemeral,
            "chat.update": self._update,
            "chat.delete": self._delete,
            "chat.startStream": self._start_stream,
            "chat.appendStream": self._append_stream,
            "chat.stopStream": self._stop_stream,
            "reactions.add": self._reactions_add,
            "reactions.remove": self._reactions_remove,
            "assistant.threads.setStatus": self._set_status,
            "conversations.info": self._conversations_info,
            "users.info": self._users_info,
            "apps.connections.open": self._connections_open,
            "files.info": self._files_info,
            "conversations.replies": self._replies,
            "conversations.history": self._history,
            "files.getUploadURLExternal": self._upload_url,
            "files.completeUploadExternal": self._complete_upload,
        }

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> FakeSlack:
        """Start listening on 127.0.0.1 with an OS-assigned port."""
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/api/{method}", self._api)  # files.info and others the SDK GETs
        app.router.add_get("/socket", self._socket)
        app.router.add_post("/respond/{key}", self._respond)
        app.router.add_get("/files-pri/{team}-{file_id}/download/{name}", self._download)
        app.router.add_post("/upload/{file_id}", self._receive_upload)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def close(self) -> None:
        """Close all sockets and stop the server."""
        await self.close_sockets()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlack:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """Web API base URL as ``AsyncWebClient(base_url=...)`` expects it."""
        return f"{self.base_url}/api/"

    def add_file(self, file_id: str, data: bytes, name: str, mimetype: str = "") -> Params:
        """Register a file; returns its file object as events carry it (``files`` items)."""
        obj: Params = {
            "id": file_id,
            "name": name,
            "title": name,
            "mimetype": mimetype or "application/octet-stream",
            "filetype": name.rsplit(".", 1)[-1] if "." in name else "binary",
            "size": len(data),
            "url_private": f"{self.base_url}/files-pri/{self.team_id}-{file_id}/{name}",
            "url_private_download": (
                f"{self.base_url}/files-pri/{self.team_id}-{file_id}/download/{name}"
            ),
            "mode": "hosted",
        }
        self.files[file_id] = (data, obj)
        return obj

    async def _download(self, request: web.Request) -> web.StreamResponse:
        file_id = request.match_info["file_id"]
        auth = request.headers.get("Authorization")
        self.file_downloads.append((file_id, auth))
        if self.file_failures > 0:
            self.file_failures -= 1
            return web.Response(status=500, text="try again")
        if auth != f"Bearer {self.bot_token}" or file_id not in self.files or not self.files_scope:
            # What Slack does without a valid token: a sign-in page, status 200.
            return web.Response(text="<html><body>Sign in</body></html>", content_type="text/html")
        data, obj = self.files[file_id]
        return web.Response(body=data, content_type=obj["mimetype"])

    def add_to_thread(
        self, channel: str, thread_ts: str, user: str, text: str, *, bot_id: str | None = None
    ) -> str:
        """Record a message in a thread (as if posted before the bot was there); its ts."""
        ts = thread_ts if not self.threads[(channel, thread_ts)] else self.next_ts()
        message: Params = {"type": "message", "user": user, "text": text, "ts": ts}
        if ts != thread_ts:
            message["thread_ts"] = thread_ts
        if bot_id:
            message["bot_id"] = bot_id
        self.threads[(channel, thread_ts)].append(message)
        return ts

    def _posted_in(self, channel: str, thread_ts: str | None) -> list[Params]:
        """The bot's messages still there in ``channel`` (its thread, or the top level)."""
        return [
            m
            for (ch, _), m in self.messages.items()
            if ch == channel
            and (m.get("thread_ts") == thread_ts if thread_ts else not m.get("thread_ts"))
        ]

    @staticmethod
    def _read_back(messages: list[Params], params: Params) -> list[Params]:
        """Messages after ``oldest`` (exclusive, as Slack), metadata only when asked for."""
        oldest = float(params.get("oldest") or 0)
        metadata = str(params.get("include_all_metadata", "")).lower() in ("1", "true")
        return [
            m if metadata else {k: v for k, v in m.items() if k != "metadata"}
            for m in messages
            if float(m["ts"]) > oldest
        ]

    async def _replies(self, params: Params) -> Params:
        self._require(params, "channel", "ts")
        channel, root = str(params["channel"]), str(params["ts"])
        seeded = self.threads.get((channel, root)) or []
        known = {m["ts"] for m in seeded}
        posted = [m for m in self._posted_in(channel, root) if m["ts"] not in known]
        if not seeded and not posted:
            raise SlackError("thread_not_found")
        thread = sorted([*seeded, *posted], key=lambda m: float(m["ts"]))
        # The parent always comes first, whatever `oldest` says (as Slack answers).
        thread = thread[:1] + self._read_back(thread[1:], params)
        start = int(params.get("cursor") or 0)
        limit = int(params.get("limit") or 100)
        page = thread[start : start + limit]
        more = start + limit < len(thread)
        meta = {"next_cursor": str(start + limit) if more else ""}
        return {"messages": page, "has_more": more, "response_metadata": meta}

    async def _history(self, params: Params) -> Params:
        self._require(params, "channel")
        channel = str(params["channel"])
        found = self._read_back(self._posted_in(channel, None), params)
        newest_first = sorted(found, key=lambda m: float(m["ts"]), reverse=True)
        limit = int(params.get("limit") or 100)
        return {"messages": newest_first[:limit], "has_more": len(newest_first) > limit}

    async def _upload_url(self, params: Params) -> Params:
        self._require(params, "filename", "length")
        file_id = f"FU{len(self._pending_uploads) + 1:06d}"
        self._pending_uploads[file_id] = {"filename": params["filename"], "data": None}
        self._pending_uploads[file_id]["length"] = int(params["length"])
        return {"upload_url": f"{self.base_url}/upload/{file_id}", "file_id": file_id}

    async def _receive_upload(self, request: web.Request) -> web.Response:
        pending = self._pending_uploads.get(request.match_info["file_id"])
        if pending is None:
            return web.Response(status=404)
        data = await request.read()
        if len(data) != pending["length"]:
            return web.Response(status=400, text="length mismatch")
        pending["data"] = data
        return web.Response(text="OK - " + str(len(data)))

    async def _complete_upload(self, params: Params) -> Params:
        files = params.get("files")
        files = json.loads(files) if isinstance(files, str) else files
        if not isinstance(files, list) or not files:
            raise SlackError("invalid_arguments")
        done = []
        for f in files:
            pending = self._pending_uploads.get(str(f.get("id")))
            if pending is None or pending["data"] is None:
                raise SlackError("file_not_found")
            self.uploads.append({
                "filename": pending["filename"], "data": pending["data"],
                "channel_id": params.get("channel_id"), "thread_ts": params.get("thread_ts"),
                "initial_comment": params.get("initial_comment"), "title": f.get("title"),
            })  # fmt: skip
            done.append({"id": f["id"], "name": pending["filename"]})
        return {"files": done}

    async def _files_info(self, params: Params) -> Params:
        file_id = str(params.get("file") or "")
        if file_id not in self.files:
            raise SlackError("file_not_found")
        return {"file": self.files[file_id][1]}

    def response_url(self, key: str = "1") -> str:
        """A ``response_url`` served by this fake; posts land in ``self.responses``."""
        return f"{self.base_url}/respond/{key}"

    def next_ts(self) -> str:
        """Next unique, increasing message ts at the current time, like ``"1700000000.000100"``
        (Slack's ts is the message's time, and the bot reads it as such)."""
        micros = max(int(time.time() * 1_000_000), self._last_ts + 100)
        self._last_ts = micros
        return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"

    # ---------------------------------------------------------------- inspection
    def posts_in(self, channel: str, thread_ts: str | None = None) -> list[Params]:
        """Successful posts in ``channel``; if ``thread_ts`` is given, only that thread's."""
        return [
            p
            for p in self.posts
            if p.get("channel") == channel
            and (thread_ts is None or p.get("thread_ts") == thread_ts)
        ]

    def timed_calls(self, method: str) -> list[tuple[float, Params]]:
        """(arrival time, params) of every call to ``method``."""
        return [
            (t, p) for t, (m, p) in zip(self.call_times, self.calls, strict=True) if m == method
        ]

    def visible(self, channel: str, thread_ts: str | None = None) -> list[str]:
        """The texts of the bot's messages in ``channel`` (and thread) as shown now."""
        return [
            m.get("text", "")
            for (ch, _), m in self.messages.items()
            if ch == channel and (thread_ts is None or m.get("thread_ts") == thread_ts)
        ]

    def calls_to(self, method: str) -> list[Params]:
        """Params of every recorded call to ``method`` (including failed ones)."""
        return [p for m, p in self.calls if m == method]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until ``predicate()`` holds; re-checked after every call and ack."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_for_ack(self, envelope_id: str, timeout: float = 5.0) -> Params:
        """Wait until the client acks ``envelope_id``; returns the ack message."""
        await self.wait_for(lambda: envelope_id in self.ack_messages, timeout)
        return self.ack_messages[envelope_id]

    async def wait_connected(self, timeout: float = 10.0) -> None:
        """Wait until at least one Socket Mode client got its ``hello``."""
        await asyncio.wait_for(self._connected.wait(), timeout)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ---------------------------------------------------------------- faults
    def fail_next(
        self,
        method: str,
        *,
        status: int = 200,
        error: str | None = None,
        retry_after: int | None = None,
        after: int = 0,
    ) -> None:
        """Queue a failure for the next call to ``method`` (or, with ``after=n``, for the call
        after the next ``n``, which are answered normally).

        A 429 defaults to ``error="ratelimited"`` and ``Retry-After: 1``.
        """
        if status == 429 and retry_after is None:
            retry_after = 1
        error = error or ("ratelimited" if status == 429 else "internal_error")
        self._skip(method, after)
        self._faults[method].append(Fault(status=status, error=error, retry_after=retry_after))

    def drop_next(self, method: str, *, after_processing: bool = True, after: int = 0) -> None:
        """Close the connection on the next call to ``method`` without answering.

        With ``after_processing`` the call takes effect (e.g. the post is recorded) first;
        ``after=n`` lets the next ``n`` calls through first.
        """
        self._skip(method, after)
        self._faults[method].append(Fault(drop=True, after_processing=after_processing))

    def _skip(self, method: str, count: int) -> None:
        for _ in range(count):
            self._faults[method].append(Fault(passthrough=True))

    # ---------------------------------------------------------------- web api
    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        params: Params = dict(request.query)
        if request.content_type == "application/json" and request.can_read_body:
            try:
                body = json.loads(await request.read())
            except ValueError:
                body = None
            if not isinstance(body, dict):
                return web.json_response({"ok": False, "error": "invalid_json"})
            params.update(body)
        else:
            params.update({k: v for k, v in (await request.post()).items() if isinstance(v, str)})
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
        token = token or params.pop("token", None)
        params.pop("token", None)
        self.calls.append((method, params))
        self.call_times.append(time.monotonic())
        fault = self._faults[method].popleft() if self._faults[method] else None
        if fault is not None and fault.passthrough:
            fault = None
        try:
            if fault and fault.drop and not fault.after_processing:
                return self._drop(request)
            if fault and not fault.drop:
                ra = fault.retry_after
                headers = {"Retry-After": str(ra)} if ra is not None else {}
                err = {"ok": False, "error": fault.error}
                return web.json_response(err, status=fault.status, headers=headers)
            result = await self._dispatch(method, token, params)
            if fault and fault.drop:
                return self._drop(request)
            return web.json_response(result)
        finally:
            await self._notify()

    @staticmethod
    def _drop(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()
        raise asyncio.CancelledError  # aiohttp stops handling; the client sees a disconnect

    async def _dispatch(self, method: str, token: str | None, params: Params) -> Params:
        handler = self._handlers.get(method)
        if handler is None:
            return {"ok": False, "error": "unknown_method"}
        if not token:
            return {"ok": False, "error": "not_authed"}
        wanted = self.app_token if method == "apps.connections.open" else self.bot_token
        if token != wanted:
            known = token in (self.app_token, self.bot_token)
            return {"ok": False, "error": "not_allowed_token_type" if known else "invalid_auth"}
        try:
            return {"ok": True, **await handler(params)}
        except SlackError as e:
            return {"ok": False, "error": e.code}

    @staticmethod
    def _require(params: Params, *names: str) -> None:
        for name in names:
            if not params.get(name):
                raise SlackError(
                    "channel_not_found" if name in ("channel", "channel_id") else f"invalid_{name}"
                )

    async def _auth_test(self, params: Params) -> Params:
        return {
            "url": "https://fake.slack.com/",
            "team": "Fake Team",
            "user": "bub",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _message(self, params: Params, ts: str) -> Params:
        msg: Params = {"type": "message", "user": self.bot_user_id, "bot_id": self.bot_id}
        msg.update(
            {
                k: params[k]
                for k in ("text", "blocks", "attachments", "thread_ts", "metadata")
                if k in params
            }
        )
        for key in ("blocks", "attachments", "metadata"):
            if isinstance(msg.get(key), str):
                msg[key] = json.loads(msg[key])
        return {**msg, "ts": ts, "team": self.team_id}

    def _check_text(self, params: Params) -> None:
        self._require(params, "channel")
        if not (params.get("text") or params.get("blocks") or params.get("attachments")):
            raise SlackError("no_text")
        if len(params.get("text") or "") > MAX_TEXT_LEN:
            raise SlackError("msg_too_long")

    async def _post_message(self, params: Params) -> Params:
        self._check_text(params)
        ts = self.next_ts()
        message = self._message(params, ts)
        self.messages[(params["channel"], ts)] = message
        self.posts.append({**params, "ts": ts})
        return {"channel": params["channel"], "ts": ts, "message": message}

    async def _post_ephemeral(self, params: Params) -> Params:
        self._check_text(params)
        self._require(params, "user")
        ts = self.next_ts()
        self.ephemerals.append({**params, "ts": ts})
        return {"message_ts": ts}

    async def _update(self, params: Params) -> Params:
        self._require(params, "channel", "ts")
        key = (params["channel"], params["ts"])
        if key not in self.messages:
            raise SlackError("message_not_found")
        if self.messages[key].get("streaming"):
            raise SlackError("cant_update_message")
        if len(params.get("text") or "") > MAX_TEXT_LEN:
            raise SlackError("msg_too_long")
        message = {**self.messages[key], **self._message(params, params["ts"])}
        message["thread_ts"] = self.messages[key].get("thread_ts")
        self.messages[key] = {k: v for k, v in message.items() if v is not None}
        self.updates.append(dict(params))
        return {
            "channel": key[0],
            "ts": key[1],
            "text": message.get("text", ""),
            "message": message,
        }

    async def _delete(self, params: Params) -> Params:
        self._require(params, "channel", "ts")
        key = (params["channel"], params["ts"])
        if self.messages.pop(key, None) is None:
            raise SlackError("message_not_found")
        self.deleted.append(key)
        return {"channel": key[0], "ts": key[1]}

    def _streaming(self, params: Params) -> tuple[str, str]:
        """The key of a message that is still streaming (or the error Slack gives)."""
        if not self.streaming_enabled:
            raise SlackError(self.streaming_error)
        self._require(params, "channel", "ts")
        key = (params["channel"], params["ts"])
        if key not in self.messages:
            raise SlackError("message_not_found")
        if not self.messages[key].get("streaming"):
            raise SlackError("message_not_in_streaming_state")
        return key

    async def _start_stream(self, params: Params) -> Params:
        if not self.streaming_enabled:
            raise SlackError(self.streaming_error)
        self._require(params, "channel", "thread_ts")
        channel = params["channel"]
        if not channel.startswith("D") and not (
            params.get("recipient_user_id") and params.get("recipient_team_id")
        ):
            raise SlackError("missing_recipient_user_id")
        text = params.get("markdown_text") or ""
        if len(text) > 12_000:
            raise SlackError("msg_too_long")
        ts = self.next_ts()
        message = {**self._message({"thread_ts": params["thread_ts"]}, ts), "text": text}
        self.messages[(channel, ts)] = {**message, "streaming": True}
        return {"channel": channel, "ts": ts}

    async def _append_stream(self, params: Params) -> Params:
        key = self._streaming(params)
        text = params.get("markdown_text") or ""
        if not text or len(text) > 12_000:
            raise SlackError("invalid_markdown_text" if not text else "msg_too_long")
        self.messages[key]["text"] += text
        return {"channel": key[0], "ts": key[1]}

    async def _stop_stream(self, params: Params) -> Params:
        key = self._streaming(params)
        self.messages[key]["text"] += params.get("markdown_text") or ""
        self.messages[key]["streaming"] = False
        return {"channel": key[0], "ts": key[1], "message": self.messages[key]}

    def _reaction_key(self, params: Params) -> tuple[str, str, str]:
        self._require(params, "channel", "timestamp", "name")
        return (params["channel"], params["timestamp"], params["name"])

    async def _reactions_add(self, params: Params) -> Params:
        key = self._reaction_key(params)
        if key in self.reactions:
            raise SlackError("already_reacted")
        self.reactions.add(key)
        return {}

    async def _reactions_remove(self, params: Params) -> Params:
        key = self._reaction_key(params)
        if key not in self.reactions:
            raise SlackError("no_reaction")
        self.reactions.discard(key)
        return {}

    async def _set_status(self, params: Params) -> Params:
        if not self.assistant_enabled:
            raise SlackError(self.assistant_error)
        self._require(params, "channel_id", "thread_ts")
        self.statuses.append(dict(params))
        return {}

    async def _conversations_info(self, params: Params) -> Params:
        self._require(params, "channel")
        cid = params["channel"]
        is_im = cid.startswith("D")
        channel = {"id": cid, "name": cid.lower(), "is_channel": not is_im, "is_im": is_im}
        return {"channel": {**channel, "is_member": True, **self.channels.get(cid, {})}}

    async def _users_info(self, params: Params) -> Params:
        self._require(params, "user")
        uid = params["user"]
        profile = {"display_name": uid.lower(), "real_name": f"User {uid}"}
        user = {"id": uid, "name": uid.lower(), "real_name": f"User {uid}", "profile": profile}
        return {"user": {**user, "is_bot": uid == self.bot_user_id, **self.users.get(uid, {})}}

    async def _connections_open(self, params: Params) -> Params:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        return {"url": f"ws://127.0.0.1:{self.port}/socket?ticket={ticket}"}

    async def _respond(self, request: web.Request) -> web.Response:
        body = await request.text()
        try:
            payload: Any = json.loads(body)
        except ValueError:
            payload = body
        self.responses.append((request.match_info["key"], payload))
        await self._notify()
        return web.Response(text="ok")

    # ---------------------------------------------------------------- socket mode
    async def _socket(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("ticket") not in self._tickets:
            return web.Response(status=401, text="invalid ticket")
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        hello = {
            "type": "hello",
            "num_connections": len(self._sockets) + 1,
            "debug_info": {"host": "fake-slack", "approximate_connection_time": 18060},
            "connection_info": {"app_id": self.app_id},
        }
        await ws.send_json(hello)
        self._sockets.add(ws)
        self._connected.set()
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                if isinstance(data, dict) and "envelope_id" in data:
                    self.acks.append(data["envelope_id"])
                    self.ack_messages[data["envelope_id"]] = data
                    await self._notify()
        finally:
            self._sockets.discard(ws)
            if not self._sockets:
                self._connected.clear()
        return ws

    async def _send_envelope(self, envelope: Params) -> str:
        if not self._sockets:
            raise RuntimeError("no Socket Mode client connected")
        for ws in list(self._sockets):
            await ws.send_json(envelope)
        return str(envelope["envelope_id"])

    async def socket_send_event(
        self, payload: Params, retry_attempt: int = 0, retry_reason: str = ""
    ) -> str:
        """Send an ``events_api`` envelope wrapping ``payload``; returns its envelope_id."""
        envelope = {
            "envelope_id": str(uuid.uuid4()),
            "payload": payload,
            "type": "events_api",
            "accepts_response_payload": False,
            "retry_attempt": retry_attempt,
            "retry_reason": retry_reason,
        }
        return await self._send_envelope(envelope)

    async def socket_send_slash_command(self, form: Params) -> str:
        """Send a ``slash_commands`` envelope wrapping ``form``; returns its envelope_id."""
        envelope = {
            "envelope_id": str(uuid.uuid4()),
            "payload": form,
            "type": "slash_commands",
            "accepts_response_payload": True,
        }
        return await self._send_envelope(envelope)

    async def socket_send_interactive(self, payload: Params) -> str:
        """Send an ``interactive`` envelope (a button press's ``block_actions``)."""
        envelope = {
            "envelope_id": str(uuid.uuid4()),
            "payload": payload,
            "type": "interactive",
            "accepts_response_payload": False,
        }
        return await self._send_envelope(envelope)

    async def socket_disconnect(self, reason: str = "refresh_requested") -> None:
        """Politely ask connected clients to reconnect (Slack's ``disconnect`` message)."""
        for ws in list(self._sockets):
            await ws.send_json({"type": "disconnect", "reason": reason})

    async def close_sockets(self) -> None:
        """Abruptly close every Socket Mode connection."""
        for ws in list(self._sockets):
            await ws.close()


# -------------------------------------------------------------------- payload builders
def new_event_id() -> str:
    """A unique event id like ``Ev0000000001AB12``."""
    return f"Ev{next(_event_seq):010d}{uuid.uuid4().hex[:4].upper()}"


def event_callback(
    event: Params,
    *,
    event_id: str | None = None,
    team_id: str = DEFAULT_TEAM_ID,
    bot_user_id: str = DEFAULT_BOT_USER_ID,
    api_app_id: str = DEFAULT_APP_ID,
) -> Params:
    """Wrap ``event`` in an Events API ``event_callback`` envelope."""
    auth: Params = {"enterprise_id": None, "team_id": team_id, "user_id": bot_user_id}
    auth |= {"is_bot": True, "is_enterprise_install": False}
    return {
        "token": VERIFICATION_TOKEN,
        "team_id": team_id,
        "context_team_id": team_id,
        "context_enterprise_id": None,
        "api_app_id": api_app_id,
        "event": event,
        "type": "event_callback",
        "event_id": event_id or new_event_id(),
        "event_time": int(time.time()),
        "authorizations": [auth],
        "is_ext_shared_channel": False,
    }


def _message_event(kind: str, channel: str, user: str, text: str, ts: str, **extra: Any) -> Params:
    event: Params = {"type": kind, "user": user, "text": text, "ts": ts, "channel": channel}
    event.update({k: v for k, v in extra.items() if v is not None})
    return {**event, "event_ts": ts, "team": DEFAULT_TEAM_ID}


def app_mention(
    channel: str,
    user: str,
    text: str,
    ts: str,
    thread_ts: str | None = None,
    event_id: str | None = None,
    bot_user_id: str = DEFAULT_BOT_USER_ID,
    files: list[Params] | None = None,
) -> Params:
    """An ``app_mention`` event callback; prefixes ``<@bot>`` if ``text`` lacks it."""
    mention = f"<@{bot_user_id}>"
    text = text if mention in text else f"{mention} {text}"
    event = _message_event("app_mention", channel, user, text, ts, thread_ts=thread_ts, files=files)
    return event_callback(event, event_id=event_id, bot_user_id=bot_user_id)


def channel_message(
    channel: str,
    user: str,
    text: str,
    ts: str,
    thread_ts: str | None = None,
    channel_type: str = "channel",
    subtype: str | None = None,
    bot_id: str | None = None,
    event_id: str | None = None,
    files: list[Params] | None = None,
) -> Params:
    """A ``message`` event callback (``message.channels`` style); with ``files`` (and
    subtype ``file_share``) a message that shares files."""
    extra = {"thread_ts": thread_ts, "subtype": subtype, "bot_id": bot_id, "files": files}
    event = _message_event("message", channel, user, text, ts, channel_type=channel_type, **extra)
    return event_callback(event, event_id=event_id)


def dm_message(
    channel: str,
    user: str,
    text: str,
    ts: str,
    thread_ts: str | None = None,
    event_id: str | None = None,
    files: list[Params] | None = None,
) -> Params:
    """A direct-message ``message`` event callback (``channel_type`` ``im``)."""
    subtype = "file_share" if files else None
    return channel_message(
        channel, user, text, ts, thread_ts, "im", subtype, event_id=event_id, files=files
    )


def url_verification(challenge: str) -> Params:
    """The Events API URL-verification handshake payload."""
    return {"token": VERIFICATION_TOKEN, "challenge": challenge, "type": "url_verification"}


def slash_command_form(
    command: str,
    text: str,
    channel_id: str,
    user_id: str,
    team_id: str = DEFAULT_TEAM_ID,
    response_url: str = "https://hooks.slack.com/commands/T1/1/fake",
) -> dict[str, str]:
    """The form fields Slack posts for a slash command."""
    return {
        "token": VERIFICATION_TOKEN,
        "team_id": team_id,
        "team_domain": "fake",
        "channel_id": channel_id,
        "channel_name": channel_id.lower(),
        "user_id": user_id,
        "user_name": user_id.lower(),
        "command": command,
        "text": text,
        "api_app_id": DEFAULT_APP_ID,
        "is_enterprise_install": "false",
        "response_url": response_url,
        "trigger_id": f"{next(_event_seq)}.{uuid.uuid4().hex[:8]}",
    }


def sign_request(
    body: bytes,
    signing_secret: str,
    timestamp: int | str | None = None,
    content_type: str | None = None,
) -> dict[str, str]:
    """Headers Slack sends with an HTTP-mode request (``v0`` HMAC-SHA256 signature).

    A string ``timestamp`` is sent (and signed) as given, to test unparsable headers."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    base = b"v0:" + ts.encode() + b":" + body
    digest = hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()
    if content_type is None:
        is_json = body.lstrip().startswith(b"{")
        content_type = "application/json" if is_json else "application/x-www-form-urlencoded"
    return {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": f"v0={digest}",
        "Content-Type": content_type,
    }
