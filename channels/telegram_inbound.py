"""Telegram messages -> `Inbound`: which messages are for us (a private chat; in a group a
mention, a reply or a command), who may talk (BUB_TELEGRAM_ALLOW_USERS / _CHATS, with a
once-an-hour id hint for a stranger in a private chat), group -> supergroup migrations, and
the text, images and files a message carries (channels/telegram_content.py reads them).
The channel (channels/telegram.py) hands every polled or posted message here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aiogram.exceptions import AiogramError, TelegramAPIError
from aiogram.types import Message

from bub_bot import commands
from bub_bot.config import Settings

from .base import DENIED, Attachment, DeliveryError, Inbound, RuntimeLike, Sender
from .telegram_content import BOT_DOWNLOAD_LIMIT, MessageReader, attachments, has_content
from .telegram_outbox import GENERAL_TOPIC, TelegramOutbox

log = logging.getLogger("channels.telegram")

HINT_INTERVAL = 3600.0
HINT_TIMEOUT = 10.0
NOT_ALLOWED = (
    "Sorry, I only talk to people I have been told about. Your Telegram user id is {id}."
    " Ask whoever runs this bot to add it to BUB_TELEGRAM_ALLOW_USERS."
)


class TelegramInbound:
    """Reads messages for the channel `name`. `migrated` (old chat id -> new) is shared with
    the channel's sends; `username` and `bot_id` are ours, set when the channel starts."""

    def __init__(
        self,
        name: str,
        settings: Settings,
        reader: MessageReader,
        outbox: TelegramOutbox,
        migrated: dict[int, int],
        scrub: Callable[[Any], str],
    ) -> None:
        self.name = name
        self.reader = reader
        self.username = ""
        self.bot_id = 0
        self.download_limit: int | None = BOT_DOWNLOAD_LIMIT
        self._outbox = outbox
        self._migrated = migrated
        self._scrub = scrub
        self._hinted: dict[int, float] = {}
        self._allow_users, self._allow_user_names, self._all_users = _allow_list(
            settings.telegram_allow_users
        )
        self._allow_chats, self._allow_chat_names, self._all_chats = _allow_list(
            settings.telegram_allow_chats
        )

    async def handle(self, message: Message, update_id: int, runtime: RuntimeLike) -> None:
        """Store one message (if it is for us); raises only when storing failed."""
        try:
            inbound = await self.inbound(message, update_id, runtime)
        except Exception:
            log.exception("telegram.update_skipped update=%d", update_id)
            return
        if inbound is None or inbound == DENIED:
            runtime.note_inbound(self.name, "ignored" if inbound is None else DENIED)
            return
        await runtime.receive(inbound)

    def is_allowed(self, message: Message) -> bool:
        """Whether the sender (or the chat) is on the allow lists."""
        user, chat = message.from_user, message.chat
        if self._all_users or self._all_chats:
            return True
        if user is not None and (
            user.id in self._allow_users
            or (user.username or "").lower() in self._allow_user_names - {""}
        ):
            return True
        return chat.id in self._allow_chats or (
            (chat.username or "").lower() in self._allow_chat_names - {""}
        )

    def addressed(self, message: Message) -> bool:
        """In a group: a mention of us, a reply to us, or a command meant for us."""
        text = message.text or message.caption or ""
        me = self.username.lower()
        for entity in message.entities or message.caption_entities or []:
            if entity.type == "mention" and entity.extract_from(text).lower() == f"@{me}":
                return True
            if entity.type == "text_mention" and entity.user and entity.user.id == self.bot_id:
                return True
            if entity.type == "bot_command":
                name, _, target = entity.extract_from(text)[1:].partition("@")
                if target.lower() == me:
                    return True
                if not target and entity.offset == 0 and name.lower() in commands.COMMANDS:
                    return True  # "/status" without a bot name is for every bot in the chat
        reply = message.reply_to_message
        # In forum topics every message "replies" to the topic's creation message.
        return bool(
            reply is not None
            and reply.from_user is not None
            and reply.from_user.id == self.bot_id
            and reply.forum_topic_created is None
        )

    async def inbound(
        self, message: Message, update_id: int, runtime: RuntimeLike
    ) -> Inbound | str | None:
        """The `Inbound` of `message`; `DENIED` for a sender not allowed, None for a message
        not for us (a migration notice moves the session instead)."""
        chat, user = message.chat, message.from_user
        migration = _migration(message)
        if migration is not None:
            old, new = migration
            self._migrated[old] = new
            log.info("telegram.chat_migrated from=%d to=%d", old, new)
            # The supergroup continues the group's conversation (same tape).
            await runtime.move_session(f"{self.name}:{old}", f"{self.name}:{new}")
            return None
        if chat.type not in ("private", "group", "supergroup") or user is None or user.is_bot:
            return None
        if message.is_automatic_forward or not has_content(message):
            return None  # service messages (joins, pins, topic events) and channel forwards
        if chat.type != "private" and not self.addressed(message):
            return None
        if not self.is_allowed(message):
            if chat.type == "private":
                await self.hint(user.id)
            else:
                log.info("telegram.ignored unauthorised user=%d chat=%d", user.id, chat.id)
            return DENIED
        bot_names = (f"@{self.username}",) if self.username else ()
        body, images = await self.reader.content(message)
        text = body
        if commands.parse(body, bot_names) is None:
            context = self.reader.reply_context(message, self.bot_id)
            if context:
                text = f"{context}\n{body}" if body else context
        thread = message.message_thread_id if message.is_topic_message else None
        if thread == GENERAL_TOPIC:
            thread = None  # the General topic: sendMessage rejects message_thread_id=1
        session = f"telegram:{chat.id}" + (f":{thread}" if thread else "")
        return Inbound(
            channel=self.name,
            session_id=session,
            delivery_key=f"{chat.id}:{message.message_id}",
            message_id=str(message.message_id),
            sent_at=message.date.timestamp(),
            sender=Sender(
                id=str(user.id), name=user.full_name, username=user.username, is_bot=user.is_bot
            ),
            text=text,
            reply_target={
                "chat_id": chat.id,
                "message_id": message.message_id,
                "thread_id": thread,
                "chat_type": chat.type,
            },
            images=tuple(images),
            attachments=tuple(self.attachments(message)),
            bot_names=bot_names,
            meta={"update_id": update_id, "chat_type": chat.type, "thread_id": thread},
        )

    async def hint(self, user_id: int) -> None:
        """Tell an unknown private user their id, at most once an hour (nothing is stored)."""
        now = time.monotonic()
        last = self._hinted.get(user_id)
        if last is not None and now - last < HINT_INTERVAL:
            return
        if len(self._hinted) > 10_000:
            self._hinted = {u: t for u, t in self._hinted.items() if now - t < HINT_INTERVAL}
        self._hinted[user_id] = now
        log.info("telegram.unauthorised user=%d (sent the id hint)", user_id)
        try:
            # Bounded: under flood control the hint is dropped rather than holding up updates.
            await asyncio.wait_for(
                self._outbox.call(
                    user_id, lambda bot: bot.send_message(user_id, NOT_ALLOWED.format(id=user_id))
                ),
                HINT_TIMEOUT,
            )
        except (TelegramAPIError, AiogramError, DeliveryError, TimeoutError) as exc:
            log.warning("telegram.hint failed user=%d: %s", user_id, self._scrub(exc))

    def attachments(self, message: Message) -> list[Attachment]:
        """The message's files (photos first), fetched later in the turn."""
        found = attachments(message, self.download_limit)
        if message.photo and (photo := self.reader.photo(message.photo)) is not None:
            found.insert(0, photo)
        return found


def _allow_list(entries: list[str]) -> tuple[set[int], set[str], bool]:
    """(ids, lower-case usernames, everyone) from a comma list setting."""
    ids: set[int] = set()
    names: set[str] = set()
    everyone = False
    for raw in entries:
        entry = raw.strip()
        if entry == "*":
            everyone = True
        elif entry.lstrip("-").isdigit():
            ids.add(int(entry))
        elif entry:
            names.add(entry.lstrip("@").lower())
    return ids, names, everyone


def _migration(message: Message) -> tuple[int, int] | None:
    """(old chat id, new chat id) when `message` announces a group -> supergroup migration:
    the old group gets `migrate_to_chat_id`, the new supergroup `migrate_from_chat_id`."""
    if message.migrate_to_chat_id:
        return message.chat.id, message.migrate_to_chat_id
    if message.migrate_from_chat_id:
        return message.migrate_from_chat_id, message.chat.id
    return None
