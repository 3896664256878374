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

from bub_bot.config import ConfigError, Settings

from . import slack_events
from .base import RuntimeLike
from .slack_approvals import SlackApprovals
from .slack_events import Rejected
from .slack_files import SlackFiles
from .slack_inbound import SlackInbound
from .slack_outbox import SlackOutbox
from .slack_recall import SlackRecall, metadata
from .slack_stream import SlackStream

log = logging.getLogger("channels.slack")

DEFAULT_API_URL = "https://slack.com/api/"
EVENTS_PATH = "/slack/events"
SOCKET_CONNECT_TIMEOUT = 30.0
BAD_TOKEN_ERRORS = (
    "invalid_auth",
    "not_authed",
    "account_inactive",
    "token_revoked",
    "token_expired",
    "not_allowed_token_type",
)


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
        self._socket: Any = None
        self.outbox = SlackOutbox(settings, self.client)
        self.messages = SlackInbound(self.name, settings, self.client, self.send)
        """Events -> `Inbound`: what is for us, who may talk (channels/slack_inbound.py)."""
        self.recalls = SlackRecall(self.client, lambda: (self.bot_id, self.bot_user_id))
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
        me = self.messages
        me.team_id = self.outbox.team_id = str(auth.get("team_id") or "")
        me.bot_user_id = str(auth.get("user_id") or "")
        me.bot_id = str(auth.get("bot_id") or "")
        me.bot_label = str(auth.get("user") or "bot")
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
        if self.messages.tasks:
            await asyncio.wait(list(self.messages.tasks), timeout=5)

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
        """How Slack writes a mention of us (`<@U123>`)."""
        return self.messages.mention

    @property
    def team_id(self) -> str:
        """Our workspace's id (known once started)."""
        return self.messages.team_id

    @property
    def bot_user_id(self) -> str:
        """The bot user's id (known once started)."""
        return self.messages.bot_user_id

    @property
    def bot_id(self) -> str:
        """The bot's id (known once started)."""
        return self.messages.bot_id

    @property
    def bot_label(self) -> str:
        """The bot user's name, for the text the model reads (known once started)."""
        return self.messages.bot_label

    # -- inbound ---------------------------------------------------------------------------
    async def _on_other_event(self, body: dict[str, Any]) -> None:
        """Events we subscribe to but do not act on are acknowledged (not 404'd)."""
        log.debug("slack.event.ignored type=%s", (body.get("event") or {}).get("type"))

    async def _on_message_event(self, body: dict[str, Any]) -> None:
        # bolt passes listener arguments by name: `body`.
        await self.messages.message_event(body, self._require_runtime())

    def _require_runtime(self) -> RuntimeLike:
        if self.runtime is None:
            raise RuntimeError("the Slack channel is not started")
        return self.runtime

    async def _on_command(self, ack: Any, command: dict[str, Any]) -> None:
        # bolt passes listener arguments by name: `ack`, `command`.
        await self.messages.command(ack, command, self._require_runtime())

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


async def _quietly(awaitable: Awaitable[Any]) -> None:
    try:
        await awaitable
    except Exception as exc:
        log.debug("slack.close failed: %s", exc)
