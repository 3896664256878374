"""Slack events -> `Inbound`: which message events are for us (a mention, a DM, a thread the
bot is in), who may talk (BUB_SLACK_ALLOW_USERS / _CHANNELS, with a once-an-hour note in a
DM), the session each message belongs to, its text as plain text for the model, the thread
before a first mention, and slash commands. The channel (channels/slack.py) receives the
checked events from bolt and hands them here."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from bub_bot.commands import COMMANDS, strip_mention
from bub_bot.config import Settings

from .base import DENIED, HistoryMessage, Inbound, RuntimeLike, Sender
from .slack_events import ACCEPTED_SUBTYPES
from .slack_files import attachments as file_attachments
from .slack_history import first_mention_history

log = logging.getLogger("channels.slack")

NOT_ENABLED = "Sorry, this bot is not enabled for you."
NOT_ENABLED_EVERY_SECONDS = 3600.0
_MARKUP_RE = re.compile(r"<([^<>]+)>")


class SlackInbound:
    """Reads events for the channel `name`; `send` posts a notice. `team_id`, `bot_user_id`,
    `bot_id` and `bot_label` are ours, set when the channel starts (auth.test)."""

    def __init__(
        self,
        name: str,
        settings: Settings,
        client: AsyncWebClient,
        send: Callable[[dict[str, Any], str], Awaitable[list[str]]],
    ) -> None:
        self.name = name
        self.settings = settings
        self.client = client
        self.team_id = ""
        self.bot_user_id = ""
        self.bot_id = ""
        self.bot_label = "bot"
        self.tasks: set[asyncio.Task[Any]] = set()
        """Notices being posted (the channel waits for them when it stops)."""
        self._send = send
        self._notified: dict[str, float] = {}

    @property
    def mention(self) -> str:
        """How Slack writes a mention of us (`<@U123>`)."""
        return f"<@{self.bot_user_id}>"

    async def message_event(self, body: dict[str, Any], runtime: RuntimeLike) -> None:
        """Store a message event's message (if it is for us and the sender may talk)."""
        inbound = await self.inbound(body, runtime)
        if inbound is None or inbound == DENIED:
            runtime.note_inbound(self.name, "ignored" if inbound is None else DENIED)
            return
        await runtime.receive(inbound)

    async def inbound(self, body: dict[str, Any], runtime: RuntimeLike) -> Inbound | str | None:
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
        mentioned = kind == "app_mention" or self.mention in normalise_mentions(raw)
        if is_dm:
            session = f"slack:{team}:{channel}" + (f":{thread_ts}" if thread_ts else "")
            reply_thread = thread_ts
        elif mentioned:
            reply_thread = thread_ts or ts
            session = f"slack:{team}:{channel}:{reply_thread}"
        elif thread_ts and not self.settings.slack_require_mention:
            session = f"slack:{team}:{channel}:{thread_ts}"
            reply_thread = thread_ts
            if not self.allowed(user, channel):
                return DENIED
            if not await runtime.session_known(session):
                return None
        else:
            return None
        if not self.allowed(user, channel):
            log.info("slack.not_allowed user=%s channel=%s", user, channel)
            if is_dm:
                self.notify_not_enabled(channel, thread_ts)
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
            text=self.clean_text(raw),
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

    def allowed(self, user: str, channel: str) -> bool:
        """Whether `user` may talk to the bot in `channel` (BUB_SLACK_ALLOW_USERS / _CHANNELS)."""
        users = self.settings.slack_allow_users
        channels = self.settings.slack_allow_channels
        return (not users or user in users) and (not channels or channel in channels)

    def clean_text(self, raw: str) -> str:
        """Slack markup -> plain text for the model: our leading mention dropped, links as
        `label (url)`, channel and special mentions readable, entities unescaped."""
        text = strip_mention(normalise_mentions(raw), (self.mention,))
        text = text.replace(self.mention, f"@{self.bot_label}")
        text = _MARKUP_RE.sub(plain_markup, text)
        return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")

    def notify_not_enabled(self, channel: str, thread_ts: str | None) -> None:
        """Tell a DM that the bot is not enabled for its sender, at most once an hour."""
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
            await self._send(target, text)
        except Exception as exc:
            log.warning("slack.notice_failed channel=%s: %s", target.get("channel"), exc)

    def _background(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def command(self, ack: Any, command: dict[str, Any], runtime: RuntimeLike) -> None:
        """Store a slash command as a message of `slack:<team>:<channel>`; acknowledge it
        (with a line for an unknown command or a sender who may not use the bot)."""
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
        if not self.allowed(user, channel):
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


def normalise_mentions(text: str) -> str:
    """`<@U123|name>` (older clients) -> `<@U123>`."""
    return re.sub(r"<@([A-Z0-9]+)\|[^>]*>", r"<@\1>", text)


def plain_markup(match: re.Match[str]) -> str:
    """One piece of Slack markup (`<url|label>`, `<#C1|name>`, `<!here>`) as plain text."""
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
