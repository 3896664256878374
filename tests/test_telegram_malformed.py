"""Malformed Telegram updates, by webhook and by long polling.

None of them may be stored, reach the model, get a 5xx or log an ERROR, or stop the updates
after them; each one is counted in the metrics. A genuine message is still answered
afterwards. In-process bot (real aiogram) against the fake Bot API and the fake model, like
tests/test_telegram.py.
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import aiohttp
import pytest

import tests.test_telegram as telegram_tests
from bub_bot.config import ConfigError
from channels.telegram import TelegramChannel
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegram
from tests.raw_http import send_raw
from tests.test_telegram import SECRET, USER

# The Telegram channel tests' fixtures, shared (assigned, not imported, so they are not re-bound).
tg = telegram_tests.tg
start = telegram_tests.start

DROP = object()
"""As a value in a case: leave the field out."""
HOOK = "/tg/hook"
DEPTH = 100_000


def nested_replies(depth: int) -> dict[str, Any]:
    message: dict[str, Any] = {"message_id": 1, "date": 1, "chat": {"id": USER, "type": "private"}}
    for _ in range(depth):
        message = {**message, "reply_to_message": message}
    return message


MESSAGE_CASES: list[tuple[str, dict[str, Any]]] = [
    # (name, changes to an otherwise answerable private text message)
    ("chat missing", {"chat": DROP}),
    ("chat a list", {"chat": [USER]}),
    ("chat id letters", {"chat": {"id": "abc", "type": "private"}}),
    ("chat id an object", {"chat": {"id": {"id": USER}, "type": "private"}}),
    ("chat id beyond 64 bits", {"chat": {"id": 2**70, "type": "private"}}),
    ("chat type missing", {"chat": {"id": USER}}),
    ("chat type a list", {"chat": {"id": USER, "type": ["private"]}}),
    ("from a list", {"from": [USER]}),
    ("from id letters", {"from": {"id": "x", "is_bot": False, "first_name": "Ann"}}),
    ("from is_bot maybe", {"from": {"id": USER, "is_bot": "maybe", "first_name": "Ann"}}),
    ("from name a list", {"from": {"id": USER, "is_bot": False, "first_name": ["Ann"]}}),
    ("text an object", {"text": {"text": "hello"}}),
    ("text a list", {"text": ["hello"]}),
    ("text a number", {"text": 5}),
    ("text a lone surrogate", {"text": "hello \ud800"}),
    ("message_id missing", {"message_id": DROP}),
    ("message_id letters", {"message_id": "abc"}),
    ("message_id an object", {"message_id": {"id": 1}}),
    ("message_id beyond 64 bits", {"message_id": 2**70}),
    ("date missing", {"date": DROP}),
    ("date words", {"date": "yesterday"}),
    ("date after year 9999", {"date": 10**30}),
    ("date before 1970", {"date": -5}),
    ("entities an object", {"entities": {"type": "mention"}}),
    ("entities strings", {"entities": ["mention"]}),
    ("entity before the text", {"entities": [{"type": "mention", "offset": -5, "length": 4}]}),
    ("entity past the text", {"entities": [{"type": "bold", "offset": 2, "length": 99}]}),
    ("caption a list", {"text": DROP, "caption": ["hi"]}),
    ("photo an object", {"photo": {"file_id": "P"}}),
    ("thread id letters", {"message_thread_id": "abc"}),
    ("reply a list", {"reply_to_message": [1]}),
    ("reply nested deeply", {"reply_to_message": nested_replies(300)}),
]
UPDATE_CASES: list[tuple[str, dict[str, Any]]] = [
    # (name, the update's fields besides update_id)
    ("message a string", {"message": "hello"}),
    ("message a list", {"message": [{"text": "hello"}]}),
    ("message a number", {"message": 5}),
    ("edited message a list", {"edited_message": [1]}),
]


def mangled(tg: FakeTelegram, changes: dict[str, Any]) -> dict[str, Any]:
    update = copy.deepcopy(tg.private_text(USER, "hello"))
    for key, value in changes.items():
        if value is DROP:
            update["message"].pop(key, None)
        else:
            update["message"][key] = value
    return update


def bad_updates(tg: FakeTelegram) -> list[tuple[str, dict[str, Any]]]:
    found = [(name, mangled(tg, changes)) for name, changes in MESSAGE_CASES]
    return found + [(name, dict(fields)) for name, fields in UPDATE_CASES]


def no_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_malformed_updates_by_polling_are_skipped_and_counted(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    h = await start()
    bad = bad_updates(tg)
    for _, update in bad:
        tg.push_update(update)
    tg.push_update(tg.private_text(USER, "genuine"))
    [reply] = await h.replies(USER, 1)
    assert reply["text"] == "echo: genuine"
    await h.idle(f"telegram:{USER}")
    assert tg.pending_updates == []  # the malformed ones were confirmed too
    assert h.inbound_count("telegram", "malformed") == len(bad)
    assert no_errors(caplog) == []
    warned = [r for r in caplog.records if r.name == "channels.telegram"]
    assert len(warned) >= len(bad)
    tapes = await h.bot.store.list_tapes(include_all=True)
    assert [t.session_id for t in tapes] == [f"telegram:{USER}"]
    assert await h.user_messages(f"telegram:{USER}") == ["genuine"]
    assert len(fake_openai.completion_requests()) == 1


async def test_malformed_webhook_requests_are_refused_or_acknowledged(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    h = await start(
        telegram_webhook_url=f"https://bot.example.test{HOOK}", telegram_webhook_secret=SECRET
    )
    caplog.set_level(logging.WARNING)
    good = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
    update = tg.private_text(USER, "hello") | {"update_id": 900}
    raw = json.dumps(update).encode()
    # (name, body, headers, expected status, counted outcome)
    cases: list[tuple[str, bytes, dict[str, str], int, str]] = [
        ("no secret", raw, {}, 401, "unauthorized"),
        ("wrong secret", raw, {**good, "X-Telegram-Bot-Api-Secret-Token": "nope"}, 401, "unauthorized"),
        ("not json", b"{not json", good, 400, "malformed"),
        ("not utf-8", raw.replace(b"hello", b"hel\xfflo"), good, 400, "malformed"),
        ("deeply nested", b'{"update_id": 1, "message": ' + b"[" * DEPTH + b"]" * DEPTH + b"}", good, 400, "malformed"),
        ("a json array", b"[1, 2]", good, 400, "malformed"),
        ("json null", b"null", good, 400, "malformed"),
        ("empty body", b"", good, 400, "malformed"),
        ("NaN", raw.replace(b'"update_id": 900', b'"update_id": NaN'), good, 400, "malformed"),
        ("update_id missing", json.dumps(update | {"update_id": None}).encode(), good, 400, "malformed"),
        ("update_id letters", json.dumps(update | {"update_id": "9"}).encode(), good, 400, "malformed"),
        ("update_id true", json.dumps(update | {"update_id": True}).encode(), good, 400, "malformed"),
        ("update_id fraction", json.dumps(update | {"update_id": 1.5}).encode(), good, 400, "malformed"),
    ]  # fmt: skip
    for n, (name, body) in enumerate(bad_updates(tg)):
        cases.append((name, json.dumps(body | {"update_id": 1000 + n}).encode(), good, 200, "malformed"))  # fmt: skip
    wrong: list[str] = []
    url = h.server.url + HOOK
    async with aiohttp.ClientSession() as http:
        for name, body, headers, expected, outcome in cases:
            before = h.inbound_count("telegram", outcome)
            seen = len(caplog.records)
            async with http.post(url, data=body, headers=headers) as resp:
                status, answer = resp.status, await resp.read()
            if status != expected:
                wrong.append(f"{name}: HTTP {status} {answer[:80]!r}, expected {expected}")
            elif status == 200 and answer:
                wrong.append(f"{name}: a 200 with a body (Telegram reads it as a method call)")
            elif status == 400 and not answer.strip():
                wrong.append(f"{name}: a 400 without a reason")
            if (counted := h.inbound_count("telegram", outcome) - before) != 1:
                wrong.append(f"{name}: counted {counted} times as {outcome}")
            new = caplog.records[seen:]
            if not any(r.name == "channels.telegram" and r.levelno == logging.WARNING for r in new):
                wrong.append(f"{name}: no WARNING line from channels.telegram")
        assert wrong == []
        assert no_errors(caplog) == []
        assert await h.stored_nothing()
        assert fake_openai.completion_requests() == [] and tg.sent == []
        # Alive, and a genuine update is still answered.
        genuine = tg.private_text(USER, "genuine") | {"update_id": 2000}
        async with http.post(url, json=genuine, headers=good) as resp:
            assert resp.status == 200
    [reply] = await h.replies(USER, 1)
    assert reply["text"] == "echo: genuine"
    assert await h.user_messages(f"telegram:{USER}") == ["genuine"]


async def test_a_webhook_secret_that_is_not_utf8_is_a_wrong_secret(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """Header bytes that are not UTF-8 (sent raw: aiohttp's client drops such a header) are
    a wrong secret: 401, counted, a WARNING; not a 500 with a traceback."""
    h = await start(
        telegram_webhook_url=f"https://bot.example.test{HOOK}", telegram_webhook_secret=SECRET
    )
    caplog.set_level(logging.WARNING)
    body = json.dumps(tg.private_text(USER, "hello") | {"update_id": 900}).encode()
    for secret in (b"\xff", SECRET.encode() + b"\xe9"):
        before = h.inbound_count("telegram", "unauthorized")
        headers = [b"Content-Type: application/json", b"X-Telegram-Bot-Api-Secret-Token: " + secret]
        status, _ = await send_raw(h.server.url, "POST", HOOK, headers, body)
        assert status == 401, secret
        assert h.inbound_count("telegram", "unauthorized") - before == 1
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert sum(r.name == "channels.telegram" for r in warned) >= 2
    assert no_errors(caplog) == []
    assert await h.stored_nothing() and fake_openai.completion_requests() == []


@pytest.mark.parametrize("secret", ["", "with space", SECRET + "\n", "x" * 257])
def test_a_webhook_secret_telegram_would_refuse_stops_the_start(settings, secret: str) -> None:
    """1-256 characters of A-Za-z0-9_-, the whole value (a trailing newline, from a file say,
    is no exception): named at start, not when setWebhook fails."""
    webhook = {
        "telegram_token": "123456:ABC-secret-part",
        "telegram_webhook_url": f"https://bot.example.test{HOOK}",
    }
    with pytest.raises(ConfigError, match="BUB_TELEGRAM_WEBHOOK_SECRET"):
        settings(**webhook, telegram_webhook_secret=secret)
    conf = settings(**webhook, telegram_webhook_secret=SECRET)
    with pytest.raises(ConfigError, match="BUB_TELEGRAM_WEBHOOK_SECRET"):
        TelegramChannel(conf.model_copy(update={"telegram_webhook_secret": secret}))
