"""`WebChannel`: the web chat as a channel like Telegram or Slack, plus the tape viewer.

Conversations are sessions `web:<id>` on the same runtime, tape, commands and agent loop
as every other channel: a posted message becomes an `Inbound` and is acknowledged only
after `runtime.receive` stored it; answers come back through `split`/`send`, which wake the
conversation's open pages so they read the new entries from the tape. While the model
writes, a `WebStream` shows the answer so far on those pages (`stream.py`). With several
replicas, the `Relay` tells the others' pages too (`relay.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from bub_bot.config import Settings
from channels.base import DeliveryError, RuntimeLike

from .auth import Access, secure
from .chat import ChatRoutes
from .forwarded import ForwardedProto
from .hub import Hub
from .relay import Relay
from .runtime import WebRuntime
from .stream import WebStream
from .uploads import SentFiles
from .usage_view import UsageViewer
from .viewer import ViewerRoutes

STATIC_DIR = Path(__file__).parent / "static"
STATIC_TYPES = {".css": "text/css", ".js": "text/javascript", ".png": "image/png"}


class WebChannel:
    """The embedded web chat (`/`) and the read-only tape viewer (`/tapes`), one token."""

    name = "web"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        token = settings.web_token
        # A token made up here (not by `Settings.with_web_token`) is shown in the start line.
        self.token_generated = token is None or settings.web_token_generated
        self.token = token or secrets.token_urlsafe(32)
        self.access = Access(
            self.token,
            max_age=settings.web_login_max_age_seconds,
            forwarded=ForwardedProto(settings.trusted_proxies, always=settings.web_cookie_secure),
        )
        self.hub = Hub()
        self.relay = Relay(self.hub)
        self.runtime: WebRuntime | None = None
        self.chat = ChatRoutes(
            settings, self.hub, self.relay, self.require_runtime, channel=self.name
        )
        self.sent_files = SentFiles(settings)
        self.viewer = ViewerRoutes(settings, self.require_runtime) if settings.web_viewer else None
        self.usage = UsageViewer(self.require_runtime)
        self._static = {
            p.name: p.read_bytes() for p in STATIC_DIR.iterdir() if p.suffix in STATIC_TYPES
        }

    def require_runtime(self) -> WebRuntime:
        """The runtime once the channel started; until then requests get 503 ("starting")."""
        if self.runtime is None:
            raise web.HTTPServiceUnavailable(
                text='{"error": "starting"}', content_type="application/json"
            )
        return self.runtime

    # -- the channel contract ------------------------------------------------------------------
    async def start(self, runtime: RuntimeLike) -> None:
        self.runtime = runtime  # type: ignore[assignment]
        self.hub.closed = False
        self.relay.start(runtime)

    async def stop(self) -> None:
        self.hub.close()

    def routes(self) -> list[tuple[str, str, Callable[..., Awaitable[Any]]]]:
        guard = self.access.guard
        chat = self.chat
        found: list[tuple[str, str, Callable[..., Awaitable[Any]]]] = [
            ("GET", "/", guard(chat.page, api=False)),
            ("POST", "/login", self.access.login),
            ("GET", "/static/{name}", self.static),
            ("GET", "/api/conversations", guard(chat.list_conversations, api=True)),
            ("POST", "/api/conversations", guard(chat.new_conversation, api=True)),
            ("GET", "/api/conversations/{conversation}", guard(chat.one_conversation, api=True)),
            ("GET", "/api/conversations/{conversation}/messages", guard(chat.messages, api=True)),
            (
                "POST",
                "/api/conversations/{conversation}/messages",
                guard(chat.post_message, api=True),
            ),
            ("GET", "/api/conversations/{conversation}/events", guard(chat.events, api=True)),
            (
                "POST",
                "/api/conversations/{conversation}/approvals/{request}",
                guard(chat.decide, api=True),
            ),
            (
                "POST",
                "/api/conversations/{conversation}/files",
                guard(chat.upload_file, api=True),
            ),
            ("GET", "/api/files/{file}", guard(self.sent_files.download, api=True)),
        ]
        if self.viewer is not None:
            viewer = self.viewer
            found += [
                ("GET", "/tapes", guard(viewer.tapes, api=False)),
                ("GET", "/tapes/{tape}", guard(viewer.tape, api=False)),
                ("GET", "/tapes/{tape}/context", guard(viewer.context, api=False)),
                ("GET", "/tapes/{tape}/spill/{handle}", guard(viewer.spilled, api=False)),
                ("GET", "/usage", guard(self.usage.overview, api=False)),
                ("GET", "/usage/users/{key}", guard(self.usage.user, api=False)),
                ("GET", "/usage/sessions/{key}", guard(self.usage.session, api=False)),
            ]
        return found

    async def send_file(
        self, target: dict[str, Any], name: str, data: bytes, mime: str, caption: str | None
    ) -> list[str]:
        """Keep a file the bot sends (`SendsFiles`); the page shows a download link for it
        (the `file.sent` entry names this id)."""
        conversation = target.get("conversation")
        if not isinstance(conversation, str) or not conversation:
            raise DeliveryError("the reply target names no web conversation")
        try:
            file_id = await asyncio.to_thread(self.sent_files.keep, conversation, name, data)
        except OSError as exc:
            raise DeliveryError(f"the file could not be kept: {exc.strerror}") from exc
        self.hub.notify(conversation)
        return [file_id]

    def fetch(self, ref: dict[str, Any], max_bytes: int) -> AsyncIterator[bytes]:
        """A file uploaded with a message (`FetchesFiles`)."""
        return self.chat.uploads.fetch(ref, max_bytes)

    def split(self, text: str) -> list[str]:
        # The page has no length limit: one answer is one piece.
        return [text]

    async def send(self, target: dict[str, Any], piece: str) -> list[str]:
        """The answer is on the tape already: wake the conversation's pages to show it."""
        conversation = target.get("conversation")
        if not isinstance(conversation, str) or not conversation:
            raise DeliveryError("the reply target names no web conversation")
        self.hub.notify(conversation)
        await self.relay.changed(conversation)
        return []

    def working(self, target: dict[str, Any]) -> contextlib.AbstractAsyncContextManager[None]:
        return self._working(str(target.get("conversation", "")))

    @contextlib.asynccontextmanager
    async def _working(self, conversation: str) -> AsyncIterator[None]:
        """The working indicator on this replica's pages and, told, on the others'."""
        if not conversation:
            async with self.hub.working(conversation):
                yield
            return
        async with self.relay.working(conversation), self.hub.working(conversation):
            yield

    def announce(self, base_url: str) -> str:
        """The line `serve` prints once it listens: where to open the chat."""
        if self.token_generated:
            return f"web chat: open {base_url}/?token={self.token}"
        return f"web chat: open {base_url}/ (log in with BUB_WEB_TOKEN)"

    # -- streaming (channels.base.Streams) -----------------------------------------------------
    def stream(self, target: dict[str, Any], shown: Sequence[str | None] = ()) -> WebStream | None:
        """The answer shown on the conversation's pages while it is written (`stream.py`);
        `shown` is always empty here: a page keeps nothing across a restart."""
        conversation = target.get("conversation")
        if not isinstance(conversation, str) or not conversation:
            return None
        return WebStream(self.hub, conversation, self.relay)

    # -- static files --------------------------------------------------------------------------
    async def static(self, request: web.Request) -> web.StreamResponse:
        """The page's CSS and JS, shipped in the package (public: no conversation data)."""
        name = request.match_info["name"]
        body = self._static.get(name)
        if body is None:
            return secure(web.json_response({"error": "not found"}, status=404))  # type: ignore[return-value]
        response = web.Response(body=body, content_type=STATIC_TYPES[Path(name).suffix])
        return secure(response, cache="no-cache")
