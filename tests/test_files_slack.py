"""Files in from Slack: `files` on an app_mention and `file_share` messages, downloaded from
FakeSlack's url_private_download with the bot token, saved under the workspace's inbox/, and
what reaches the model."""

from __future__ import annotations

import base64
from pathlib import Path

from tests import test_slack
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_api import FakeSlack, app_mention, dm_message
from tests.files_data import PNG, make_pdf
from tests.runtime_channel import inbound_users
from tests.test_files_telegram import _inbox, _text

slack = test_slack.slack  # the Slack harness's fixtures
start_bot = test_slack.start_bot
sid = test_slack.sid
StartBot = test_slack.StartBot


async def test_a_pdf_in_a_thread_mention_is_read_with_the_bot_token(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI, workspace: Path
) -> None:
    bot = await start_bot()
    pdf = make_pdf(["Revenue grew 12 percent"])
    obj = slack.add_file("F1", pdf, "Q3 report.pdf", "application/pdf")
    ts = slack.next_ts()
    status, _ = await bot.post(app_mention("C1", "U1", "summarise this", ts, files=[obj]))
    assert status == 200
    # Stored before the 200 with the file's platform id; nothing downloaded yet by then.
    [stored] = await inbound_users(bot.tape(sid("C1", ts)))
    assert stored.meta["attachments"][0]["ref"]["id"] == "F1"
    await bot.idle(sid("C1", ts))
    assert slack.file_downloads == [("F1", f"Bearer {slack.bot_token}")]
    sent = fake_openai.last_messages()
    assert sent[-2]["content"] == "summarise this"
    last = _text(sent[-1])
    assert "file: Q3 report.pdf — application/pdf" in last
    assert "Revenue grew 12 percent" in last
    [saved] = _inbox(workspace)
    assert saved.suffix == ".pdf" and saved.read_bytes() == pdf


async def test_a_screenshot_in_a_dm_reaches_the_model_as_an_image(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    bot = await start_bot()
    obj = slack.add_file("F2", PNG, "Screenshot 2026-12-02.png", "image/png")
    ts = slack.next_ts()
    await bot.post(dm_message("D1", "U1", "", ts, files=[obj]))
    await bot.idle(sid("D1"))
    content = fake_openai.last_messages()[-1]["content"]
    assert (
        content[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(PNG).decode()
    )


async def test_the_token_never_goes_to_a_url_off_slack(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI, workspace: Path
) -> None:
    bot = await start_bot()
    obj = slack.add_file("F3", b"secret", "a.txt", "text/plain")
    obj = obj | {"url_private_download": fake_openai.base_url + "/steal/a.txt"}
    ts = slack.next_ts()
    await bot.post(dm_message("D1", "U1", "read it", ts, files=[obj]))
    await bot.idle(sid("D1"))
    assert "could not be fetched: the file's URL is not on Slack's file host" in _text(
        fake_openai.last_messages()[-1]
    )
    assert not [r for r in fake_openai.requests if "steal" in r.path]
    assert _inbox(workspace) == []


async def test_a_failing_download_is_retried_and_files_info_fills_a_missing_url(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI, workspace: Path
) -> None:
    bot = await start_bot()
    obj = slack.add_file("F4", b"a,b\n1,2\n", "t.csv", "text/csv")
    slack.file_failures = 1
    ts = slack.next_ts()
    # Some events carry only the id (file_access: check_file_info).
    await bot.post(dm_message("D1", "U1", "", ts, files=[{"id": obj["id"]}]))
    await bot.idle(sid("D1"))
    assert [c["file"] for c in slack.calls_to("files.info")] == ["F4", "F4"]  # per attempt
    assert [f for f, _ in slack.file_downloads] == ["F4", "F4"]
    assert "a,b\n1,2" in _text(fake_openai.last_messages()[-1])
    assert len(_inbox(workspace)) == 1


async def test_without_files_read_slack_sends_a_page_and_the_model_is_told(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    bot = await start_bot()
    obj = slack.add_file("F5", b"x", "n.txt")
    slack.files_scope = False
    ts = slack.next_ts()
    await bot.post(dm_message("D1", "U1", "", ts, files=[obj]))
    await bot.idle(sid("D1"))
    assert "files:read scope" in _text(fake_openai.last_messages()[-1])
