"""`send_file`: the model posts a workspace file into the conversation — Telegram
(sendPhoto / sendDocument through the real aiogram client) and Slack (the external upload
flow) — once, never through a symlink, never outside the workspace."""

from __future__ import annotations

import os
from pathlib import Path

from tests import test_slack, test_telegram
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.fakes.slack_api import FakeSlack, app_mention
from tests.fakes.telegram_api import FakeTelegram
from tests.files_data import PNG

USER = test_telegram.USER
start = test_telegram.start  # the harnesses' fixtures
tg = test_telegram.tg
slack = test_slack.slack
start_bot = test_slack.start_bot
sid = test_slack.sid
StartBot = test_slack.StartBot


def _send(path: str, caption: str | None = None, call: str = "c1"):
    args = {"path": path} | ({"caption": caption} if caption else {})
    return tool_calls([("send_file", args)])


def _tool_results(fake_openai: FakeOpenAI) -> list[str]:
    return [m["content"] for m in fake_openai.last_messages() if m["role"] == "tool"]


async def test_telegram_gets_a_document_and_a_photo(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI, workspace: Path
) -> None:
    (workspace / "out").mkdir()
    (workspace / "out" / "report.csv").write_text("a,b\n1,2\n")
    (workspace / "chart.png").write_bytes(PNG)
    h = await start()
    fake_openai.script(
        _send("out/report.csv", "the report"), _send("chart.png", call="c2"), text("done")
    )
    tg.push_update(tg.private_text(USER, "send me the report and the chart"))
    await h.replies(USER, 1)
    doc, photo = tg.files_sent
    assert (doc["method"], doc["file_name"], doc["data"]) == (
        "document",
        "report.csv",
        b"a,b\n1,2\n",
    )
    assert doc["message"]["caption"] == "the report"
    assert (photo["method"], photo["data"]) == ("photo", PNG)
    events = await h.tape(f"telegram:{USER}").query(kinds=["event"])
    sent = [e.payload["data"] for e in events if e.payload["name"] == "file.sent"]
    assert [(d["path"], d["type"]) for d in sent] == [
        ("out/report.csv", "text/csv"),
        ("chart.png", "image/png"),
    ]


async def test_the_same_file_for_the_same_message_is_posted_once_and_symlinks_are_refused(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "a.txt").write_text("hello")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    os.symlink(secret, workspace / "link.txt")
    os.symlink(tmp_path, workspace / "up")
    h = await start()
    fake_openai.script(
        _send("a.txt"), _send("a.txt", call="c2"), _send("link.txt", call="c3"),
        _send("up/secret.txt", call="c4"), _send("../secret.txt", call="c5"), text("ok"),
    )  # fmt: skip
    tg.push_update(tg.private_text(USER, "send a.txt"))
    await h.replies(USER, 1)
    assert [f["data"] for f in tg.files_sent] == [b"hello"]
    # Secret files are never sent (the file tools' rule).
    (workspace / ".env").write_text("OPENAI_API_KEY=sk-x")
    fake_openai.script(_send(".env", call="c6"), text("no"))
    tg.push_update(tg.private_text(USER, "send .env"))
    await h.replies(USER, 2)
    assert "may hold secrets" in _tool_results(fake_openai)[-1]
    assert len(tg.files_sent) == 1
    results = _tool_results(fake_openai)
    assert "already sent in this conversation" in results[1]
    assert "'link.txt' leads outside the workspace (through a symlink)" in results[2]
    assert "'up/secret.txt' leads outside the workspace" in results[3]
    assert "'..' is not allowed" in results[4]


async def test_slack_gets_the_file_in_the_thread(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI, workspace: Path
) -> None:
    (workspace / "notes.md").write_text("# Notes\n")
    bot = await start_bot()
    fake_openai.script(_send("notes.md", "here you are"), text("sent"))
    ts = slack.next_ts()
    await bot.post(app_mention("C1", "U1", "send me the notes", ts))
    await bot.idle(sid("C1", ts))
    [upload] = slack.uploads
    assert (upload["filename"], upload["data"]) == ("notes.md", b"# Notes\n")
    assert upload["channel_id"] == "C1" and upload["thread_ts"] == ts
    assert upload["initial_comment"] == "here you are"
