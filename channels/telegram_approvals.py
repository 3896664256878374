"""Approval requests in Telegram: an inline keyboard (Approve / Deny) under the request, a
press arrives as a `callback_query` (webhook or long polling), is stored (`runtime.decide`)
and then answered with `answerCallbackQuery` (a note for a refusal, "already decided", an
unknown or forged press); once settled, the keyboard gives way to who decided what.

`callback_data` holds at most 64 bytes: `a:<request id>:<digest>` / `d:…` (31 bytes).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from aiogram.types import CallbackQuery, InlineKeyboardButton, InlineKeyboardMarkup, Message

from .base import CLICK_APPROVED, CLICK_DENIED, ApprovalClick, RuntimeLike, Sender, click_note
from .telegram_outbox import GENERAL_TOPIC, TelegramOutbox

log = logging.getLogger("channels.telegram")

_DATA = re.compile(r"([ad]):([0-9a-f]{12}):([0-9a-f]{16})")
TEXT_LIMIT = 3900


def keyboard(request: dict[str, Any]) -> InlineKeyboardMarkup:
    bound = f"{request['id']}:{request['digest']}"
    return InlineKeyboardMarkup(
        inline_keyboard=[
            [
                InlineKeyboardButton(text="Approve", callback_data=f"a:{bound}"),
                InlineKeyboardButton(text="Deny", callback_data=f"d:{bound}"),
            ]
        ]
    )


def _body(request: dict[str, Any]) -> str:
    text = request["text"].rsplit("\nReply /approve", 1)[0]
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "…"


class TelegramApprovals:
    """Posts requests with the keyboard, settles them, answers presses."""

    def __init__(
        self, outbox: TelegramOutbox, route: Any, api: Any, name: str = "telegram"
    ) -> None:
        self.outbox = outbox
        self.route = route
        self.api = api
        self.name = name

    async def ask(self, target: dict[str, Any], request: dict[str, Any]) -> list[str]:
        chat_id = self.route(int(target["chat_id"]))
        thread = target.get("thread_id")
        kwargs: dict[str, Any] = {"reply_markup": keyboard(request), "parse_mode": None}
        if thread not in (None, GENERAL_TOPIC):
            kwargs["message_thread_id"] = int(thread)
        sent = await self.outbox.call(
            chat_id, lambda bot: bot.send_message(chat_id, _body(request), **kwargs)
        )
        return [str(sent.message_id)]

    async def settle(
        self, target: dict[str, Any], ids: list[str], request: dict[str, Any], text: str
    ) -> None:
        chat_id = self.route(int(target["chat_id"]))
        for message_id in ids:
            await self.outbox.call(
                chat_id,
                lambda bot, mid=int(message_id): bot.edit_message_text(
                    text=f"{_body(request)}\n\n{text}",
                    chat_id=chat_id,
                    message_id=mid,
                    parse_mode=None,
                ),
            )

    async def press(self, query: CallbackQuery, runtime: RuntimeLike) -> None:
        """Store a press, then answer it (an unusable one is answered, never stored)."""
        found = _DATA.fullmatch(query.data or "")
        message = query.message
        if found is None or not isinstance(message, Message):
            log.warning(
                "telegram.callback_ignored user=%s: not an approval button", query.from_user.id
            )
            await self._answer(query, "Unknown button.")
            return
        thread = message.message_thread_id if message.is_topic_message else None
        if thread == GENERAL_TOPIC:
            thread = None
        session = f"{self.name}:{message.chat.id}" + (f":{thread}" if thread else "")
        user = query.from_user
        outcome = await runtime.decide(
            ApprovalClick(
                channel=self.name,
                session_id=session,
                request_id=found.group(2),
                digest=found.group(3),
                decision="approve" if found.group(1) == "a" else "deny",
                user=Sender(str(user.id), user.full_name, user.username),
                key=f"callback:{query.id}",
            )
        )
        await self._answer(
            query, click_note(outcome), alert=outcome not in (CLICK_APPROVED, CLICK_DENIED)
        )

    async def _answer(self, query: CallbackQuery, text: str, alert: bool = False) -> None:
        try:
            async with self.api() as bot:
                await bot.answer_callback_query(query.id, text=text, show_alert=alert)
        except Exception as exc:  # the press is stored; only the note is lost
            log.warning("telegram.callback_answer_failed: %s", exc)
