"""Slack (slack-bolt, async): Socket Mode or HTTP Events API, threads, safe delivery.

Inbound. Every request (HTTP) and envelope (Socket Mode) is first checked in `slack_events`
(signature and timestamp on the raw bytes, the body, the type of every field we use): what is
unusable gets 401/400, or a 200 for a signed event that is no usable message, and is counted
as "malformed"/"unauthorized"; slack-bolt only ever sees the cleaned body. Bolt's `AsyncApp`
(`url_verification`, ignoring the bot's own events) runs with `process_before_response=True`,
so our listener awaits `runtime.receive` *before* bolt acknowledges: the HTTP 200 (or Socket
Mode ack) means "on disk". Slack's re-deliveries (`X-Slack-Retry-Num`, `retry_attempt`) are
processed like first deliveries; the runtime drops them by `event_id`, and by channel + `ts`
because one mention arrives as both `app_mention` and `message`.

Sessions: `slack:<team>:<channel>:<thread_ts>` in channels (the thread root, or the mention's
own ts for a new thread); DMs `slack:<team>:<channel>` at top level and the thread's session
inside a DM thread; slash commands act on `slack:<team>:<channel>` (Slack sends no thread
for them; inside threads people write `@bot /handoff`).

Outbound. `split` converts the model's Markdown to mrkdwn and cuts it under 4 000 bytes;
`send` posts one piece with `chat.postMessage`, paced to `BUB_SLACK_RATE_CHANNEL` (Slack's
one message a second per channel) with channels taking turns (`pacing`). The Web API client
has no retry handlers: a 429 holds every call of that method for its Retry-After (Slack's
limits are per method) and only that piece is re-posted; a connection lost after the request
went out raises `DeliveryUnknown`, so nothing is ever posted twice. Streaming
(`slack_stream`): `chat.startStream`/`appendStream`/`stopStream` in threads, else a message
edited with `chat.update`, through the same `SlackOutbox.call`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from bub_bot.commands import COMMANDS, strip_mention
from bub_bot.config import ConfigError, Settings

from . import slack_events
from .base import DENIED, HistoryMessage, Inbound, RuntimeLike, Sender
from .slack_approvals import SlackApprovals
from .slack_events import ACCEPTED_SUBTYPES, Rejected
from .slack_files import SlackFiles
from .slack_files import attachments as file_attachments
from .slack_history import first_mention_history
from .slack_outbox import SlackOutbox
from .slack_recall import SlackRecall, metadata
from .slack_stream import SlackStream

log = logging.getLogger("channels.slack")

DEFAULT_API_URL = "https://slack.com/api/"
EVENTS_PATH = "/slack/events"
NOT_ENABLED = "Sorry, this bot is not enabled for you."
NOT_ENABLED_EVERY_SECONDS = 3600.0
SOCKET_CONNECT_TIMEOUT = 30.0
BAD_TOKEN_ERRORS = (
    "invalid_auth",
    "not_authed",
    "account_inactive",
    "token_revoked",
    "token_expired",
    "not_allowed_token_type",
)
_MARKUP_RE = re.compile(r"<([^<>]+)>")


class SlackChannel:
    """The Slack channel: HTTP mode (`routes()`) or Socket Mode (connects in `start`)."""

    name = "slack"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        token = settings.slack_bot_token or ""
        if not token.startswith("xoxb-"):
            raise ConfigError("BUB_SLACK_BOT_TOKEN must be a bot token starting with xoxb-")
        app_token = settings.slack_app_token
        if app_token and not app_token.startswith("xapp-"):
            raise ConfigError("BUB_SLACK_APP_TOKEN must be an app token starting with xapp-")
        if not app_token and not settings.slack_signing_secret:
            raise ConfigError(
                "BUB_SLACK_APP_TOKEN (Socket Mode) or BUB_SLACK_SIGNING_SECRET (HTTP events)"
                " must be set with BUB_SLACK_BOT_TOKEN"
            )
        self.mode = "socket" if app_token else "http"
        self.api_url = settings.slack_api_url or DEFAULT_API_URL
        if not self.api_url.endswith("/"):
            self.api_url += "/"
        # No retry handlers: the SDK's connection-error retry would re-post a message whose
        # first post may have landed. Rate limits are handled in `SlackOutbox.call`.
        self.client = AsyncWebClient(token=token, base_url=self.api_url, retry_handlers=[])
        self.app = AsyncApp(
            client=self.client,
            signing_secret=settings.slack_signing_secret or "",
            process_before_response=True,
            # Signatures are checked on the raw bytes in `slack_events.verify`, before bolt
            # gets a request (bolt is handed the checked, cleaned body, as in Socket Mode).
            request_verification_enabled=False,
        )
        self.app.event("app_mention")(self._on_message_event)
        self.app.event("message")(self._on_message_event)
        self.app.command(re.compile(r"^/"))(self._on_command)
        self.app.event(re.compile(r".*"))(self._on_other_event)
        self.runtime: RuntimeLike | None = None
        self.team_id = ""
        self.bot_user_id = ""
        self.bot_id = ""
        self.bot_label = "bot"
        self._socket: Any = None
        self._notified: dict[str, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.outbox = SlackOutbox(settings, self.client)
        self.recalls = SlackRecall(self.client)
        """Finds a piece posted before its delivery was recorded (`channels.base.Recalls`)."""
        self.approvals = SlackApprovals(self.outbox, lambda: self.team_id)
        """Approval requests with Block Kit buttons (channels/slack_approvals.py)."""
        self.files = SlackFiles(token, self.api_url, self.client)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self, runtime: RuntimeLike) -> None:
        try:
            auth = await self.client.auth_test()
        except SlackApiError as exc:
            error = exc.response.get("error", "error")
            if error in BAD_TOKEN_ERRORS:
                raise ConfigError(
                    f"BUB_SLACK_BOT_TOKEN was rejected by Slack ({error}): check the bot token"
                ) from None
            raise ConfigError(f"Slack auth.test failed ({error}) for BUB_SLACK_BOT_TOKEN") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConfigError(
                f"cannot reach the Slack Web API at {self.api_url} (BUB_SLACK_API_URL): {exc}"
            ) from None
        self.team_id = self.outbox.team_id = str(auth.get("team_id") or "")
        self.bot_user_id = str(auth.get("user_id") or "")
        self.bot_id = str(auth.get("bot_id") or "")
        self.bot_label = str(auth.get("user") or "bot")
        self.runtime = runtime
        if self.mode == "socket":
            await self._connect_socket()
        log.info(
            "slack.ready mode=%s team=%s bot_user=%s", self.mode, self.team_id, self.bot_user_id
        )

    async def _connect_socket(self) -> None:
        from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

        app_token = self.settings.slack_app_token or ""
        opener = AsyncWebClient(base_url=self.api_url)
        # The SDK's connect() retries forever, also on a rejected token: check it first
        # (the URL is then used for the first connection; reconnects ask for new ones).
        try:
            opened = await opener.apps_connections_open(app_token=app_token)
        except SlackApiError as exc:
            error = exc.response.get("error", "error")
            raise ConfigError(
                f"BUB_SLACK_APP_TOKEN was rejected by Slack ({error}): Socket Mode needs an"
                " app-level token with connections:write"
            ) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConfigError(
                f"cannot reach the Slack Web API at {self.api_url} (BUB_SLACK_API_URL): {exc}"
            ) from None
        handler = AsyncSocketModeHandler(self.app, app_token=app_token, web_client=opener)
        # Envelopes pass the same checks as HTTP requests before bolt sees them.
        handler.client.socket_mode_request_listeners[:] = [partial(self._on_envelope, handler)]
        handler.client.wss_uri = opened["url"]
        try:
            await asyncio.wait_for(handler.connect_async(), SOCKET_CONNECT_TIMEOUT)
        except TimeoutError:
            await _quietly(handler.close_async())
            raise ConfigError(
                f"no Socket Mode connection within {SOCKET_CONNECT_TIMEOUT:.0f} s"
                " (BUB_SLACK_APP_TOKEN)"
            ) from None
        self._socket = handler

    async def stop(self) -> None:
        if self._socket is not None:
            handler, self._socket = self._socket, None
            await _quietly(handler.close_async())
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    def routes(self) -> list[tuple[str, str, Callable[..., Awaitable[Any]]]]:
        if self.mode != "http":
            return []
        return [("POST", EVENTS_PATH, self._http)]

    async def _http(self, request: web.Request) -> web.StreamResponse:
        if self.runtime is None:
            # Not started yet: Slack retries later; nothing was acknowledged.
            return web.Response(status=503, text="starting")
        raw = await request.read()
        if slack_events.is_ssl_check(raw, request.content_type):
            return web.Response(status=200)
        try:
            secret = self.settings.slack_signing_secret or ""
            slack_events.verify(secret, request.headers, raw)
            received = slack_events.read_body(raw, request.content_type)
            body = slack_events.clean(received)
        except Rejected as exc:
            self._rejected(exc, "http")
            # A 200 carries no text: for a slash command Slack would show it to the user.
            return web.Response(status=exc.status, text="" if exc.status == 200 else exc.reason)
        if body is None:
            self._not_used(received)
            return web.Response(status=200)
        if body.get("type") == "block_actions":
            return web.Response(status=await self.approvals.press(body, self.runtime))
        # As a dict ("socket_mode"), bolt takes the cleaned body as it is: no second parse.
        bolt_request = AsyncBoltRequest(body=body, headers=request.headers, mode="socket_mode")
        return await to_aiohttp_response(await self.app.async_dispatch(bolt_request))

    async def _on_envelope(self, handler: Any, client: Any, request: Any) -> None:
        """One Socket Mode envelope: checked like an HTTP request, then handed to bolt; an
        unusable one is acknowledged (Slack would re-send it otherwise) and dropped."""
        try:
            body = slack_events.clean(request.payload)
            if body is None:
                self._not_used(request.payload)
        except Rejected as exc:
            self._rejected(exc, "socket")
            body = None
        if body is not None and body.get("type") == "block_actions" and self.runtime is not None:
            await self.approvals.press(body, self.runtime)  # stored before the ack
            body = None
        if body is None:
            await client.send_socket_mode_response(SocketModeResponse(request.envelope_id))
            return
        request.payload = body
        await handler.handle(client, request)

    def _rejected(self, exc: Rejected, via: str) -> None:
        log.warning(
            "slack.request.rejected via=%s kind=%s status=%d: %s",
            via,
            exc.kind,
            exc.status,
            exc.reason,
        )
        if self.runtime is not None:
            self.runtime.note_inbound(self.name, exc.outcome)

    @staticmethod
    def _not_used(received: dict[str, Any]) -> None:
        """Log a request of a kind the bot does not use (acknowledged, not acted on)."""
        kind = received.get("type")
        if kind == "app_rate_limited":
            log.warning("slack.app_rate_limited: Slack dropped events to this app for a minute")
        else:
            log.info("slack.request.ignored kind=%s", str(kind)[:40])

    @property
    def mention(self) -> str:
        return f"<@{self.bot_user_id}>"

    # -- inbound ---------------------------------------------------------------------------
    async def _on_other_event(self, body: dict[str, Any]) -> None:
        """Events we subscribe to but do not act on are acknowledged (not 404'd)."""
        log.debug("slack.event.ignored type=%s", (body.get("event") or {}).get("type"))

    async def _on_message_event(self, body: dict[str, Any]) -> None:
        runtime = self._require_runtime()
        inbound = await self._inbound(body, runtime)
        if inbound is None or inbound == DENIED:
            runtime.note_inbound(self.name, "ignored" if inbound is None else DENIED)
            return
        await runtime.receive(inbound)

    def _require_runtime(self) -> RuntimeLike:
        if self.runtime is None:
            raise RuntimeError("the Slack channel is not started")
        return self.runtime

    async def _inbound(self, body: dict[str, Any], runtime: RuntimeLike) -> Inbound | str | None:
        """The Inbound for a message event, or None when it is not for us."""
        event = body.get("event") or {}
        kind = event.get("type")
        subtype = event.get("subtype")
        if subtype not in ACCEPTED_SUBTYPES or event.get("hidden"):
            return None
        user = event.get("user") or ""
        bot_id = event.get("bot_id") or ""
        if (user and user == self.bot_user_id) or (bot_id and bot_id == self.bot_id):
            return None
        if (bot_id or subtype == "bot_message") and not self.settings.slack_allow_bots:
            return None
        user = user or bot_id
        channel = event.get("channel") or ""
        ts = event.get("ts") or ""
        if not user or not channel or not ts:
            return None
        team = body.get("team_id") or event.get("team") or self.team_id
        channel_type = event.get("channel_type") or ("im" if channel.startswith("D") else "")
        is_dm = channel_type == "im"
        raw = event.get("text") or ""
        thread_ts = event.get("thread_ts") or None
        mentioned = kind == "app_mention" or self.mention in _normalise_mentions(raw)
        if is_dm:
            session = f"slack:{team}:{channel}" + (f":{thread_ts}" if thread_ts else "")
            reply_thread = thread_ts
        elif mentioned:
            reply_thread = thread_ts or ts
            session = f"slack:{team}:{channel}:{reply_thread}"
        elif thread_ts and not self.settings.slack_require_mention:
            session = f"slack:{team}:{channel}:{thread_ts}"
            reply_thread = thread_ts
            if not self._allowed(user, channel):
                return DENIED
            if not await runtime.session_known(session):
                return None
        else:
            return None
        if not self._allowed(user, channel):
            log.info("slack.not_allowed user=%s channel=%s", user, channel)
            if is_dm:
                self._notify_not_enabled(channel, thread_ts)
            return DENIED
        profile = event.get("user_profile") or {}
        name = profile.get("display_name") or profile.get("real_name") or event.get("username")
        history: list[HistoryMessage] = []
        if mentioned and not is_dm and thread_ts and thread_ts != ts:
            ids = (self.bot_user_id, self.bot_id)
            cap = self.settings.slack_thread_history
            history = await first_mention_history(
                self.client, runtime, session, channel, thread_ts, ts, cap, ids
            )
        return Inbound(
            channel=self.name,
            session_id=session,
            delivery_key=str(body.get("event_id") or f"{channel}:{ts}"),
            message_id=ts,
            sent_at=float(ts),
            sender=Sender(id=user, name=name or user, is_bot=bool(bot_id)),
            text=self._clean_text(raw),
            reply_target={
                "team": team,
                "channel": channel,
                "thread_ts": reply_thread,
                "ts": ts,
                "user": user,
            },
            extra_keys=(f"{channel}:{ts}",),
            attachments=tuple(file_attachments(event.get("files") or [])),
            history=tuple(history),
            bot_names=(self.mention,),
            meta={
                "team": team,
                "channel": channel,
                "channel_type": channel_type or "channel",
                "ts": ts,
                "thread_ts": thread_ts,
                "event": kind,
            },
        )

    def _allowed(self, user: str, channel: str) -> bool:
        users = self.settings.slack_allow_users
        channels = self.settings.slack_allow_channels
        return (not users or user in users) and (not channels or channel in channels)

    def _clean_text(self, raw: str) -> str:
        """Slack markup -> plain text for the model: our leading mention dropped, links as
        `label (url)`, channel and special mentions readable, entities unescaped."""
        text = strip_mention(_normalise_mentions(raw), (self.mention,))
        text = text.replace(self.mention, f"@{self.bot_label}")
        text = _MARKUP_RE.sub(_plain_markup, text)
        return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")

    def _notify_not_enabled(self, channel: str, thread_ts: str | None) -> None:
        now = time.monotonic()
        last = self._notified.get(channel)
        if last is not None and now - last < NOT_ENABLED_EVERY_SECONDS:
            return
        if len(self._notified) > 10_000:
            self._notified = {
                k: t for k, t in self._notified.items() if now - t < NOT_ENABLED_EVERY_SECONDS
            }
        self._notified[channel] = now
        target = {"channel": channel, "thread_ts": thread_ts}
        self._background(self._post_quietly(target, NOT_ENABLED))

    async def _post_quietly(self, target: dict[str, Any], text: str) -> None:
        try:
            await self.send(target, text)
        except Exception as exc:
            log.warning("slack.notice_failed channel=%s: %s", target.get("channel"), exc)

    def _background(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_command(self, ack: Any, command: dict[str, Any]) -> None:
        runtime = self._require_runtime()
        typed = str(command.get("command") or "")
        prefix = self.settings.slack_command_prefix
        name = typed.lstrip("/")
        if not name.startswith(prefix) or name[len(prefix) :].lower() not in COMMANDS:
            log.warning("slack.command.unknown command=%s prefix=%r", typed, prefix)
            known = ", ".join(f"/{prefix}{c}" for c in COMMANDS)
            await ack(
                text=f"{typed} is not a command of this bot (BUB_SLACK_COMMAND_PREFIX is"
                f" {prefix!r}; commands: {known})"
            )
            return
        name = name[len(prefix) :].lower()
        user = str(command.get("user_id") or "")
        channel = str(command.get("channel_id") or "")
        team = str(command.get("team_id") or self.team_id)
        if not self._allowed(user, channel):
            log.info("slack.not_allowed user=%s channel=%s command=/%s", user, channel, name)
            await ack(text=NOT_ENABLED)
            return
        trigger = str(command.get("trigger_id") or uuid.uuid4().hex)
        args = str(command.get("text") or "").strip()
        inbound = Inbound(
            channel=self.name,
            session_id=f"slack:{team}:{channel}",
            delivery_key=f"command:{trigger}",
            message_id=trigger,
            sender=Sender(id=user, name=str(command.get("user_name") or user)),
            text=f"/{name} {args}".strip(),
            reply_target={
                "team": team,
                "channel": channel,
                "user": user,
                "ephemeral": True,
                "response_url": command.get("response_url"),
            },
            bot_names=(self.mention,),
            meta={"team": team, "channel": channel, "slash_command": typed},
        )
        await runtime.receive(inbound)
        await ack()

    # -- outbound (channels/slack_outbox.py) ------------------------------------------------
    async def send_file(
        self, target: dict[str, Any], name: str, data: bytes, mime: str, caption: str | None
    ) -> list[str]:
        """Post a file in the thread (`SendsFiles`): files.getUploadURLExternal, the upload,
        files.completeUploadExternal."""
        return await self.files.send(target, name, data, caption)

    def fetch(self, ref: dict[str, Any], max_bytes: int) -> AsyncIterator[bytes]:
        """A shared file's bytes (`FetchesFiles`), downloaded with the bot token."""
        return self.files.fetch(ref, max_bytes)

    def split(self, text: str) -> list[str]:
        return self.outbox.split(text)

    async def send(self, target: dict[str, Any], piece: str) -> list[str]:
        return await self.outbox.send(target, piece)

    async def send_keyed(self, target: dict[str, Any], piece: str, key: str) -> list[str]:
        """`send` with the delivery key in the message metadata (`channels.base.Recalls`)."""
        return await self.outbox.send(target, piece, metadata=metadata(key))

    async def recall(self, target: dict[str, Any], key: str) -> list[str] | None:
        """The message posted with `key` in the target's thread (channels/slack_recall.py)."""
        return await self.recalls.find(target, key)

    def stream(
        self, target: dict[str, Any], shown: Sequence[str | None] = ()
    ) -> SlackStream | None:
        """The reply shown while it is written (channels/slack_stream.py); none for the
        ephemeral replies of slash commands."""
        return self.outbox.stream(target, shown)

    def working(self, target: dict[str, Any]) -> contextlib.AbstractAsyncContextManager[None]:
        return self.outbox.working(target)

    async def ask(self, target: dict[str, Any], request: dict[str, Any]) -> list[str]:
        """An approval request with Approve / Deny buttons (channels.base.Approvals)."""
        return await self.approvals.ask(target, request)

    async def settle(
        self, target: dict[str, Any], ids: list[str], request: dict[str, Any], text: str
    ) -> None:
        """The request was decided: its buttons give way to who decided what."""
        await self.approvals.settle(target, ids, request, text)


def _normalise_mentions(text: str) -> str:
    """`<@U123|name>` (older clients) -> `<@U123>`."""
    return re.sub(r"<@([A-Z0-9]+)\|[^>]*>", r"<@\1>", text)


def _plain_markup(match: re.Match[str]) -> str:
    inner = match.group(1)
    target, _, label = inner.partition("|")
    if target.startswith("@"):
        return match.group(0)  # a user mention stays as Slack wrote it
    if target.startswith("#"):
        return f"#{label or target[1:]}"
    if target.startswith("!"):
        special = target[1:].split("^")[0]
        return label or (f"@{special}" if special in ("here", "channel", "everyone") else "")
    if label and label != target:
        return f"{label} ({target})"
    return target.removeprefix("mailto:") if target.startswith("mailto:") else target


async def _quietly(awaitable: Awaitable[Any]) -> None:
    try:
        await awaitable
    except Exception as exc:
        log.debug("slack.close failed: %s", exc)
