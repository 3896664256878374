"""Files in from Telegram: documents, images, voice notes through the real aiogram client
against FakeTelegram's getFile + file download, saved under the workspace's inbox/, and what
reaches the model (FakeOpenAI, also its /v1/audio/transcriptions)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tests import test_telegram
from tests.fakes.openai_server import FakeOpenAI, slow, text, tool_calls
from tests.fakes.telegram_api import FakeTelegram
from tests.files_data import OGG, PNG, make_pdf
from tests.runtime_channel import inbound_users, until

USER = test_telegram.USER
start = test_telegram.start  # the Telegram harness's fixtures
tg = test_telegram.tg

SESSION = f"telegram:{USER}"


def _inbox(workspace: Path) -> list[Path]:
    box = workspace / "inbox"
    return sorted(box.iterdir()) if box.exists() else []


def _text(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type") == "text")


async def test_a_csv_with_a_hostile_name_lands_in_the_inbox_and_reaches_the_model_inline(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI, workspace: Path
) -> None:
    h = await start()
    csv = b"name,qty\napple,3\npear,5\n"
    hostile = "../../.bashrc/..\\evil name;rm -rf.csv"
    tg.push_update(tg.file_message(USER, "document", "D1", csv, caption="sum the qty",
                                   file_name=hostile, mime_type="application/x-msdownload"))  # fmt: skip
    await h.replies(USER, 1)
    sent = fake_openai.last_messages()
    assert sent[-2] == {"role": "user", "content": "sum the qty"}
    [saved] = _inbox(workspace)
    assert saved.parent == workspace / "inbox" and saved.read_bytes() == csv
    assert saved.name.endswith("-evil-name-rm--rf.csv") and ".." not in saved.name
    last = _text(sent[-1])
    assert f"file: {hostile} — text/csv, 24 B, saved as inbox/{saved.name}" in last
    assert "apple,3\npear,5" in last
    assert not (workspace.parent / ".bashrc").exists()


async def test_a_pdf_reaches_the_model_as_its_text(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI, workspace: Path
) -> None:
    h = await start()
    pdf = make_pdf(["Quarterly revenue grew", "Costs fell by a third"])
    # The name and type the sender claims are wrong: the content decides.
    tg.push_update(tg.file_message(USER, "document", "D2", pdf, caption="summarise this",
                                   file_name="report.txt", mime_type="text/plain"))  # fmt: skip
    await h.replies(USER, 1)
    last = _text(fake_openai.last_messages()[-1])
    assert "application/pdf" in last
    assert "--- page 1 ---\nQuarterly revenue grew" in last
    assert "--- page 2 ---\nCosts fell by a third" in last
    [saved] = _inbox(workspace)
    assert saved.suffix == ".pdf"


async def test_an_image_document_is_shown_to_the_model(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    tg.push_update(tg.file_message(USER, "document", "D3", PNG, file_name="shot.bin"))
    await h.replies(USER, 1)
    content = fake_openai.last_messages()[-1]["content"]
    assert "image/png" in content[0]["text"]
    assert (
        content[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(PNG).decode()
    )


async def test_a_voice_note_is_transcribed_and_the_transcript_is_on_the_tape(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    fake_openai.transcripts[OGG] = "please book a table for two"
    tg.push_update(tg.file_message(USER, "voice", "V1", OGG, duration=40, mime_type="audio/ogg"))
    await h.replies(USER, 1)
    [(model, _name, data)] = fake_openai.transcriptions
    assert (model, data) == ("whisper-1", OGG)
    assert fake_openai.last_messages()[-1]["content"] == (
        "[voice message: 0:40, transcribed] please book a table for two"
    )
    await h.idle(SESSION)
    entries = await h.tape(SESSION).query(kinds=["message"])
    marked = [e for e in entries if e.meta.get("transcribed")]
    assert len(marked) == 1 and "book a table" in marked[0].payload["content"]
    # Search finds it (it is the message's text on the tape).
    assert marked[0].id in [e.id for e in await h.tape(SESSION).query(text="book a table")]


async def test_voice_without_a_transcription_endpoint_says_so(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    fake_openai.transcribe_missing = True
    tg.push_update(tg.file_message(USER, "voice", "V2", OGG, duration=5))
    await h.replies(USER, 1)
    assert "(voice not transcribed: the provider offers no transcription)" in _text(
        fake_openai.last_messages()[-1]
    )


async def test_too_long_audio_and_too_large_files_get_a_note_and_nothing_is_saved(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI, workspace: Path
) -> None:
    h = await start(attachment_max_bytes=2048, transcribe_max_seconds=60)
    tg.push_update(tg.file_message(USER, "voice", "V3", OGG, duration=600))
    await h.replies(USER, 1)
    assert "(voice not transcribed: longer than 1:00)" in _text(fake_openai.last_messages()[-1])
    assert fake_openai.transcriptions == []
    # Over BUB_ATTACHMENT_MAX_BYTES, the size Telegram claims: not even downloaded.
    tg.push_update(tg.file_message(USER, "document", "D4", b"x" * 5000, file_name="big.txt"))
    await h.replies(USER, 2)
    assert "too large (5 KB); the limit is 2 KB (BUB_ATTACHMENT_MAX_BYTES)" in _text(
        fake_openai.last_messages()[-1]
    )
    assert "documents/D4" not in tg.file_downloads
    # Over Telegram's own 20 MB: the user is told why.
    tg.push_update(tg.file_message(USER, "document", "D5", b"x", file_name="huge.zip",
                                   file_size=30 * 1024 * 1024))  # fmt: skip
    await h.replies(USER, 3)
    assert "Telegram bots cannot download files over 20 MB" in _text(
        fake_openai.last_messages()[-1]
    )
    assert [p.name for p in _inbox(workspace) if not p.name.startswith("20")] == []
    assert [p for p in _inbox(workspace) if p.suffix != ".ogg"] == []


async def test_a_failed_download_is_retried_and_saved_once(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI, workspace: Path
) -> None:
    h = await start()
    tg.file_failures = 1
    tg.push_update(tg.file_message(USER, "document", "D6", b"hello\n", file_name="a.md"))
    await h.replies(USER, 1)
    assert tg.file_downloads == ["documents/D6", "documents/D6"]
    [saved] = _inbox(workspace)
    assert saved.read_bytes() == b"hello\n" and saved.suffix == ".md"
    assert "hello" in _text(fake_openai.last_messages()[-1])
    [stored] = await inbound_users(h.tape(SESSION))
    assert stored.meta["attachments"][0]["ref"] == {"file_id": "D6"}


async def test_a_file_that_cannot_be_fetched_reaches_the_model_as_a_note(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI, workspace: Path
) -> None:
    h = await start()
    update = tg.file_message(USER, "document", "D7", b"gone", file_name="gone.txt")
    del tg.files["D7"]
    tg.push_update(update)
    await h.replies(USER, 1)
    assert "[file: gone.txt: could not be fetched: Telegram refused it" in _text(
        fake_openai.last_messages()[-1]
    )
    assert _inbox(workspace) == []


async def test_a_file_sent_during_a_turn_reaches_the_model_at_its_next_step(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    fake_openai.script(slow(tool_calls([("tape.info", {})]), 1.0), text("done"))
    tg.push_update(tg.private_text(USER, "wait for my file"))
    await until(lambda: len(fake_openai.completion_requests()) == 1, timeout=8)
    tg.push_update(tg.file_message(USER, "document", "M1", b"late,data\n", file_name="late.csv"))
    await h.replies(USER, 1)
    second = fake_openai.completion_requests()[1].body["messages"]
    assert any("late,data" in _text(m) for m in second if m["role"] == "user")


async def test_an_inbox_planted_as_a_symlink_is_refused(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (workspace / "inbox").symlink_to(outside)  # e.g. planted by a command in the workspace
    h = await start()
    tg.push_update(tg.file_message(USER, "document", "S1", b"payload", file_name="x.txt"))
    await h.replies(USER, 1)
    assert "could not be saved: inbox/ is not a directory of the workspace" in _text(
        fake_openai.last_messages()[-1]
    )
    assert list(outside.iterdir()) == []


async def test_transcription_is_retried_and_can_be_turned_off(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    fake_openai.transcribe_failures = 1  # a 500 first: tried again within the turn
    fake_openai.transcripts[OGG] = "hello there"
    tg.push_update(tg.file_message(USER, "voice", "R1", OGG, duration=3))
    await h.replies(USER, 1)
    assert "transcribed] hello there" in _text(fake_openai.last_messages()[-1])
    await h.server.stop()
    h2 = await start(transcribe_model="off")
    tg.push_update(tg.file_message(USER, "voice", "R2", OGG + b"x", duration=3))
    await h2.replies(USER, 2)
    assert "(voice not transcribed: transcription is off)" in _text(fake_openai.last_messages()[-1])
    assert len(fake_openai.transcriptions) == 1


async def test_no_transcription_once_the_senders_budget_is_spent(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start(budget_user="100/day")
    used = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
    fake_openai.script(text("hello", usage=used))
    tg.push_update(tg.private_text(USER, "hi"))
    await h.replies(USER, 1)
    fake_openai.transcripts[OGG] = "never transcribed"
    tg.push_update(tg.file_message(USER, "voice", "B1", OGG, duration=4, mime_type="audio/ogg"))
    replies = await h.replies(USER, 2)
    assert "budget" in str(replies[-1]).lower()
    assert fake_openai.transcriptions == []  # the provider was not paid for it
    await h.idle(SESSION)
    entries = await h.tape(SESSION).query(kinds=["message"])
    notes = [e for e in entries if e.meta.get("attachments_of")]
    assert len(notes) == 1
    assert "(voice not transcribed: the budget is used up)" in notes[0].payload["content"]
