"""The edge of the Telegram channel: every update is checked here, from the webhook and from
long polling alike, before the channel reads it.

aiogram's models (pydantic) check the types and coerce harmless variants ("42" -> 42), but
they let through what no real update contains and what breaks later: text with lone
surrogates (the model request cannot be encoded), ids beyond 64 bits, dates before 1970,
entity offsets outside the text (a negative offset slices from the end), nesting hundreds of
levels deep. And aiogram's `getUpdates` rejects a whole batch when one update in it does not
validate, so one malformed update would stall polling for good: `RawGetUpdates` fetches the
updates as plain JSON and each one is read here on its own.

`Malformed.status` is what a webhook request gets: 400 for a body that is no update at all,
200 for an update that is unusable (acknowledged, so Telegram does not retry it). Reasons
name fields, never values (they go to the log).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiogram.methods import GetUpdates
from aiogram.types import Message, Update
from pydantic import ValidationError

from .telegram_format import utf16_len

if TYPE_CHECKING:
    from aiogram import Bot

MAX_DEPTH = 32
"""Nesting a real update never comes near (a message in a reply in an update: about 8)."""
MAX_ID = 2**63 - 1


class Malformed(ValueError):
    """An update (or webhook body) the bot cannot use."""

    def __init__(self, reason: str, *, status: int = 200, update_id: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.update_id = update_id


class RawGetUpdates(GetUpdates):
    """`getUpdates` answered as plain JSON values, to be read one by one by `read_update`."""

    __returning__ = list[Any]


def parse_body(body: bytes) -> Any:
    """A webhook request body as JSON; raises Malformed(400)."""
    if not body:
        raise Malformed("empty body", status=400)
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise Malformed("body is not UTF-8", status=400) from None
    except RecursionError:
        raise Malformed("JSON nested too deeply", status=400) from None
    except ValueError:
        raise Malformed("malformed JSON", status=400) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def update_id(data: Any) -> int | None:
    """The update's id when it is readable (a non-negative integer), else None."""
    if not isinstance(data, dict):
        return None
    value = data.get("update_id")
    if type(value) is not int or not 0 <= value <= MAX_ID:  # bool is not an id
        return None
    return value


def read_update(data: Any, bot: Bot | None) -> Update:
    """The update, checked: raises Malformed for anything a real update would not contain."""
    uid = update_id(data)
    if uid is None:
        raise Malformed("not a Telegram update (no update_id)", status=400)
    try:
        _check_json(data)
        try:
            update = Update.model_validate(data, context={"bot": bot})
        except ValidationError as exc:
            raise Malformed(f"unreadable: {_first_error(exc)}") from None
        except RecursionError:
            raise Malformed("nested too deeply") from None
        if update.message is not None:
            _check_message(update.message)
    except Malformed as exc:
        exc.update_id = uid
        raise
    return update


def _check_json(data: Any) -> None:
    """No nesting deeper than MAX_DEPTH, no string with lone surrogates (iteratively: the
    point is to survive hostile input)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not _unicode(value):
                raise Malformed("text that is not valid Unicode")
        elif isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                raise Malformed("nested too deeply")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and not _unicode(key):
                    raise Malformed("a key that is not valid Unicode")
                stack.append((item, depth + 1))


def _check_message(message: Message) -> None:
    """What pydantic accepts but the channel cannot use."""
    ids = [message.message_id, message.chat.id, message.message_thread_id]
    if message.from_user is not None:
        ids.append(message.from_user.id)
    if any(i is not None and not -MAX_ID <= i <= MAX_ID for i in ids):
        raise Malformed("an id beyond 64 bits")
    if message.date.timestamp() <= 0:
        raise Malformed("a date before 1970")
    for text, entities in (
        (message.text, message.entities),
        (message.caption, message.caption_entities),
    ):
        size = utf16_len(text or "")
        for entity in entities or ():
            if entity.offset < 0 or entity.length < 0 or entity.offset + entity.length > size:
                raise Malformed("an entity outside its text")


def _first_error(exc: ValidationError) -> str:
    """Where and what, without the offending value: `message.text: string_type`."""
    errors = exc.errors(include_url=False, include_input=False)
    if not errors:
        return "invalid"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()))[:80]
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where or 'update'}: {first.get('type', 'invalid')}{more}"


def _unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
