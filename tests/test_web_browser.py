"""The web chat and the tape viewer in a real headless Chromium (Debian's, driven by
Playwright), against `bub-bot serve` as a real process with no channel tokens: it must serve
the web chat and print the login URL, which the browser opens.

One serve process, one fake model and one browser for the whole module.
Set BUB_WEB_SCREENSHOT=docs/web-chat.png to refresh the README's screenshot.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect

from tests.fakes.openai_server import FakeOpenAI, slow, streamed, text, tool_calls
from tests.serve_process import free_port

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("BUB_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
URL_LINE = re.compile(r"web chat: open (http://\S+/\?token=(\S+))")


@dataclass
class Served:
    """The running `bub-bot serve` and what it printed."""

    proc: asyncio.subprocess.Process
    login_url: str
    base_url: str
    fake: FakeOpenAI


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    home = tmp_path_factory.mktemp("web-serve")
    (home / "ws").mkdir()
    fake = FakeOpenAI()
    await fake.start()
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BUB_", "OPENAI_", "SLACK_", "TELEGRAM_")) and k != "PORT"
    }
    env.update(
        PYTHONPATH=str(ROOT),
        BUB_HOME=str(home / "home"),
        BUB_WORKSPACE=str(home / "ws"),
        BUB_HOST="127.0.0.1",
        PORT=str(port),
        OPENAI_BASE_URL=fake.base_url,
        OPENAI_API_KEY="sk-test",
        BUB_MODEL="fake-model",
        BUB_MODEL_RETRIES="0",
        BUB_SPILL_THRESHOLD="20",
        # Approvals in the page: scheduling asks first (test_approval_buttons).
        BUB_APPROVE="schedule.add=ask",
    )
    # cwd without a .env: only the settings above count. No Telegram or Slack token.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bub_bot",
        "serve",
        cwd=home,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        match = URL_LINE.search(line)
        assert match, f"serve printed {line!r}"
        login_url = match.group(1)
        assert login_url.startswith(f"http://127.0.0.1:{port}/?token=")
        yield Served(proc, login_url, f"http://127.0.0.1:{port}", fake)
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)
        await fake.stop()
    assert proc.returncode == 0
    assert proc.stderr is not None
    log = (await proc.stderr.read()).decode()
    assert match.group(2) not in log  # the token is never logged


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    assert Path(CHROMIUM).exists(), f"Chromium not found at {CHROMIUM}: apt-get install chromium"
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        await launched.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def logged_in(served: Served, browser: Browser) -> AsyncIterator[BrowserContext]:
    """A browser profile that opened the printed login URL once."""
    context = await browser.new_context(viewport={"width": 1200, "height": 760})
    page = await context.new_page()
    await page.goto(served.login_url)
    assert page.url.split("#")[0] == served.base_url + "/"  # the token left the address bar
    await page.close()
    yield context
    await context.close()


async def _chat_page(context: BrowserContext, served: Served) -> Page:
    page = await context.new_page()
    await page.goto(served.base_url + "/")
    await expect(page.locator("#conversations a.current")).to_have_count(1)  # page is ready
    before = page.url
    await page.click("#new-conversation")
    await page.wait_for_function("(before) => location.href !== before", arg=before)
    await expect(page.locator("#conversations a.current")).to_have_text("New conversation")
    return page


async def _say(page: Page, message: str) -> None:
    await page.fill("#text", message)
    await page.press("#text", "Enter")


async def test_login_takes_the_printed_token_only(served: Served, browser: Browser) -> None:
    context = await browser.new_context()
    page = await context.new_page()
    try:
        response = await page.goto(served.base_url + "/")
        assert response is not None and response.status == 401
        await page.fill("input[name=token]", "not-the-token")
        async with page.expect_navigation() as nav:
            await page.click("button[type=submit]")
        assert (await nav.value).status == 401
        await expect(page.locator(".note")).to_contain_text("not valid")
        token = served.login_url.split("token=", 1)[1]
        await page.fill("input[name=token]", token)
        await page.click("button[type=submit]")
        await expect(page.locator("#composer")).to_be_visible()
        assert page.url.split("#")[0] == served.base_url + "/"
    finally:
        await context.close()


async def test_chat_answers_commands_and_reload(served: Served, logged_in: BrowserContext) -> None:
    page = await _chat_page(logged_in, served)
    answer = (
        "Here is a **plan**:\n\n1. Read the tape since the last anchor\n2. Hand off with a"
        " summary\n\n```python\nprint('no build step')\n```"
    )
    served.fake.script(slow(text(answer), 1.5))
    await _say(page, "How do phases work here?")
    await expect(page.locator("#working")).to_be_visible()
    await page.reload()  # mid-turn: the reloaded page shows the question and picks up the answer
    await expect(page.locator("#messages .item.user")).to_contain_text(["How do phases work here?"])
    await expect(page.locator("#working")).to_be_visible()
    bot = page.locator("#messages .item.bot")
    await expect(bot.last.locator("strong")).to_have_text("plan")
    await expect(bot.last.locator("pre code")).to_have_text("print('no build step')")
    await expect(page.locator("#working")).to_be_hidden()

    await page.reload()
    await expect(page.locator("#messages .item.user")).to_contain_text(["How do phases work here?"])
    await expect(page.locator("#messages .item.bot strong")).to_have_text("plan")

    served.fake.script(text("We planned how phases work."))
    await _say(page, "/handoff")
    await expect(page.locator("#messages .item.anchor").last).to_contain_text(
        "We planned how phases work."
    )
    await expect(bot.last).to_contain_text("Handed off")
    screenshot = await page.screenshot()
    assert screenshot[:8] == b"\x89PNG\r\n\x1a\n"
    target = os.environ.get("BUB_WEB_SCREENSHOT")
    if target:
        (ROOT / target).write_bytes(screenshot)

    await _say(page, "/reset")
    await expect(bot.last).to_contain_text("Started a fresh conversation")
    await page.reload()
    await expect(page.locator("#messages .item.anchor").first).to_contain_text("archived")
    await expect(page.locator("#messages")).not_to_contain_text("How do phases work here?")
    await page.close()


async def test_new_entries_read_this_conversation_not_the_list(
    served: Served, logged_in: BrowserContext
) -> None:
    """Each `entries` event changes one conversation: the page reads that one's row (its
    title and time) until it has its title, then only moves it up; never the whole list
    again."""
    page = await _chat_page(logged_in, served)
    reads: list[str] = []
    page.on(
        "request",
        lambda r: (
            reads.append(r.url.split("/api/", 1)[1])
            if r.method == "GET" and "/api/conversations" in r.url and not r.url.endswith("/events")
            else None
        ),
    )
    bot = page.locator("#messages .item.bot")
    for n, question in enumerate(["the first question", "a second one", "and a third"], 1):
        served.fake.script(text(f"answer {n}"))
        await _say(page, question)
        await expect(bot).to_have_count(n)
        await expect(bot.last).to_contain_text(f"answer {n}")
    current = page.locator("#conversations a.current")
    await expect(current).to_have_text("the first question")
    await expect(current).to_have_count(1)
    assert "conversations" not in reads  # the list itself: not read again
    conversation = page.url.split("#", 1)[1]
    assert reads and set(reads) == {f"conversations/{conversation}"}
    # Six `entries` events (three questions, three answers): the row is read for its title
    # (twice at most: the answer may come before the first read is back), then not again.
    assert len(reads) <= 2, reads
    await page.close()


async def test_markup_from_the_model_never_runs(served: Served, logged_in: BrowserContext) -> None:
    page = await _chat_page(logged_in, served)
    served.fake.script(
        text(
            "<script>window.pwned = 'script'</script>\n\n"
            "<img src=x onerror=\"window.pwned = 'img'\">\n\n"
            "[click me](javascript:window.pwned='link')"
        )
    )
    await _say(page, "<b onmouseover=\"window.pwned='user'\">hi</b>")
    bot = page.locator("#messages .item.bot").last
    await expect(bot).to_contain_text("<script>window.pwned = 'script'</script>")
    await expect(bot).to_contain_text("<img src=x onerror=")
    await bot.hover()
    await page.locator("#messages .item.user").last.hover()
    await asyncio.sleep(0.2)
    assert await page.evaluate("window.pwned") is None
    assert await page.locator("#messages img, #messages script, #messages b").count() == 0
    await page.close()


STREAMED = (
    "Streaming, **step by step**: <script>window.pwned = 'partial script'</script> and"
    " <img src=x onerror=\"window.pwned = 'partial img'\"> stay text while the model writes"
    " them, word after word, until the answer is complete.\n\n"
    "```python\nprint('a code block written slowly')\n```\n\nDone."
)
WATCH = """() => {
  // Every state of the partial answer the page shows, in order (the page's DOM, observed).
  window.partials = [];
  const messages = document.getElementById("messages");
  new MutationObserver(() => {
    const el = messages.querySelector(".item.bot.partial");
    const text = el ? el.textContent : null;
    const markup = messages.querySelectorAll("script, img").length;
    const last = window.partials[window.partials.length - 1];
    if (!last || last.text !== text || last.markup !== markup) {
      window.partials.push({ text, markup });
    }
  }).observe(messages, { childList: true, subtree: true, characterData: true });
}"""


async def test_the_answer_streams_in_and_survives_a_reload(
    served: Served, logged_in: BrowserContext
) -> None:
    page = await _chat_page(logged_in, served)
    await page.evaluate(WATCH)
    served.fake.script(
        streamed(tool_calls([("tape_info", {})], content="Let me check."), seconds=0.3),
        streamed(text(STREAMED), chunks=30, seconds=3.0),
    )
    await _say(page, "Stream it, please")
    partial = page.locator("#messages .item.bot.partial")
    await page.wait_for_function(
        "() => window.partials.filter(p => (p.text || '').startsWith('Streaming')).length >= 3"
    )
    states = await page.evaluate("window.partials")
    # While a step calls tools the page says so; then the answer grows in place.
    assert any(s["text"] == "using tape_info…" for s in states)
    texts = [s["text"] for s in states if (s["text"] or "").startswith("Streaming")]
    assert all(len(a) < len(b) for a, b in itertools.pairwise(texts))
    assert all(s["markup"] == 0 for s in states)  # the <script> and <img> are text
    # A reload mid-answer picks up the answer so far, then the final replaces it.
    await page.reload()
    await expect(partial).to_contain_text("Streaming, step by step")
    bot = page.locator("#messages .item.bot").last
    await expect(bot).to_contain_text("Done.")
    await expect(partial).to_have_count(0)
    await expect(bot.locator("pre code")).to_have_text("print('a code block written slowly')")
    await expect(bot).to_contain_text("<img src=x onerror=")
    await expect(page.locator("#working")).to_be_hidden()
    assert await page.evaluate("window.pwned") is None
    assert await page.locator("#messages img, #messages script").count() == 0
    await page.close()


async def test_viewer_shows_session_anchor_spill_and_context(
    served: Served, logged_in: BrowserContext
) -> None:
    page = await _chat_page(logged_in, served)
    conversation = page.url.split("#", 1)[1]
    served.fake.script(tool_calls([("tape_info", {})]), text("The tape is small."))
    await _say(page, "How big is this tape?")
    await expect(page.locator("#messages .item.bot").last).to_contain_text("The tape is small.")
    await _say(page, "/handoff Viewer phase: we measured the tape")
    await expect(page.locator("#messages .item.anchor").last).to_contain_text("we measured")

    await page.click("a.viewer-link")
    row = page.locator("table.tapes a", has_text=f"web:{conversation}")
    await expect(row).to_have_count(1)
    await row.click()
    await expect(page.locator("ol.timeline")).to_contain_text("handoff")
    await expect(page.locator("ol.timeline .summary")).to_contain_text(
        "Viewer phase: we measured the tape"
    )
    await page.click("a.tab >> text=All")
    await expect(page.locator(".entry.kind-tool_call")).to_contain_text("tape_info")
    await expect(page.locator(".entry .flag").first).to_have_text("not in context")

    await page.locator(".side a[href*='/spill/']").first.click()
    await expect(page.locator("h1")).to_contain_text("Spilled output sp_")
    await expect(page.locator("main pre").first).to_contain_text("entries")
    await page.go_back()
    await page.click("a.tab >> text=Context now")
    await expect(page.locator("h1")).to_have_text("Context now")
    await expect(page.locator(".msg.role-system")).to_have_count(1)
    await expect(page.locator(".msg.role-user")).to_contain_text(
        "Viewer phase: we measured the tape"
    )
    await page.close()


async def test_approval_buttons(served: Served, logged_in: BrowserContext) -> None:
    page = await _chat_page(logged_in, served)
    call = ("schedule_add", {"prompt": "water the plants", "in_seconds": 3600})
    served.fake.script(tool_calls([call]), text("Scheduled."), tool_calls([call]), text("Fine."))
    await _say(page, "remind me to water the plants in an hour")
    request = page.locator("#messages .item.approval").last
    await expect(request).to_contain_text("schedule.add")
    await expect(request.locator("button.approval-approve")).to_be_visible()
    screenshot = await page.screenshot()
    assert screenshot[:8] == b"\x89PNG\r\n\x1a\n"
    target = os.environ.get("BUB_APPROVAL_SCREENSHOT")
    if target:
        (ROOT / target).write_bytes(screenshot)
    await request.locator("button.approval-approve").click()
    await expect(page.locator("#messages .item.notice").last).to_contain_text("Approved by")
    await expect(page.locator("#messages .item.bot").last).to_have_text("Scheduled.")
    await expect(request.locator("button")).to_have_count(0)
    results = [
        m["content"]
        for m in served.fake.completion_requests()[-1].body["messages"]
        if m["role"] == "tool"
    ]
    assert "water the plants" in results[-1]  # the job was added: the call ran

    await _say(page, "again")
    request = page.locator("#messages .item.approval").last
    await expect(request.locator("button.approval-deny")).to_be_visible()
    await request.locator("button.approval-deny").click()
    await expect(page.locator("#messages .item.bot").last).to_have_text("Fine.")
    await page.reload()  # the settled request shows no buttons after a reload either
    await expect(page.locator("#messages .approval-buttons")).to_have_count(0)
    # A replayed press is "already decided"; a forged one (wrong digest, unknown id) is 404.
    conversation = page.url.split("#", 1)[1]
    base = f"{served.base_url}/api/conversations/{conversation}/approvals"
    history = await page.request.get(f"{served.base_url}/api/conversations/{conversation}/messages")
    asked = [i["approval"] for i in (await history.json())["items"] if i.get("approval")]
    press = {"decision": "approve", "digest": asked[-1]["digest"]}
    replay = await page.request.post(f"{base}/{asked[-1]['id']}", data=press)
    assert replay.status == 409
    forged = await page.request.post(
        f"{base}/{asked[-1]['id']}", data={**press, "digest": "0" * 16}
    )
    assert forged.status == 404
    unknown = await page.request.post(f"{base}/{'a' * 12}", data=press)
    assert unknown.status == 404


async def test_files_by_button_and_by_drop_reach_the_model(
    served: Served, logged_in: BrowserContext
) -> None:
    page = await _chat_page(logged_in, served)
    await page.set_input_files(
        "#files", files=[{"name": "notes.csv", "mimeType": "text/csv", "buffer": b"a,b\n1,2\n"}]
    )
    await expect(page.locator("#attached")).to_contain_text("notes.csv")
    await _say(page, "what is in it?")
    await expect(page.locator("#messages .item.user").first).to_contain_text("what is in it?")
    await expect(page.locator("#attached")).to_be_hidden()

    def seen(needle: str) -> bool:
        return any(needle in str(r.body.get("messages")) for r in served.fake.completion_requests())

    for _ in range(200):
        if seen("a,b\\n1,2"):
            break
        await asyncio.sleep(0.05)
    assert seen("file: notes.csv — text/csv, 8 B, saved as inbox/")
    # Drag and drop onto the composer, then send with no text: the file is the message.
    await page.evaluate(
        """() => {
        const dt = new DataTransfer();
        dt.items.add(new File(["dropped text\\n"], "drop.md", { type: "text/markdown" }));
        const form = document.getElementById("composer");
        form.dispatchEvent(new DragEvent("dragover", { dataTransfer: dt, bubbles: true }));
        form.dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true }));
    }"""
    )
    await expect(page.locator("#attached")).to_contain_text("drop.md")
    await page.press("#text", "Enter")
    for _ in range(200):
        if seen("dropped text"):
            break
        await asyncio.sleep(0.05)
    assert seen("file: drop.md — text/markdown")
    await page.close()


async def test_a_file_the_bot_sends_is_a_download_link(
    served: Served, logged_in: BrowserContext
) -> None:
    page = await _chat_page(logged_in, served)
    await page.set_input_files(
        "#files", files=[{"name": "data.json", "mimeType": "application/json", "buffer": b"[1, 2]"}]
    )
    await _say(page, "keep this")
    pattern = re.compile(r"saved as (inbox/[A-Za-z0-9._-]+\.json)")
    path = None
    for _ in range(200):
        found = [
            pattern.search(str(r.body.get("messages"))) for r in served.fake.completion_requests()
        ]
        path = next((m.group(1) for m in found if m), None)
        if path:
            break
        await asyncio.sleep(0.05)
    assert path is not None
    await expect(page.locator("#messages .item.bot")).to_have_count(1)
    served.fake.script(tool_calls([("send_file", {"path": path})]), text("there it is"))
    await _say(page, "send it back")
    link = page.locator("#messages .item.bot a[download]")
    await expect(link).to_have_count(1)
    await expect(link).to_contain_text(path.rsplit("/", 1)[1])
    href = await link.get_attribute("href")
    assert href is not None and href.startswith("/api/files/")
    got = await page.request.get(served.base_url + href)
    assert got.status == 200 and await got.body() == b"[1, 2]"
    assert got.headers["content-disposition"].startswith("attachment;")
    anonymous = await page.context.browser.new_context()  # type: ignore[union-attr]
    try:
        refused = await anonymous.request.get(served.base_url + href)
        assert refused.status == 401  # behind the chat's token
    finally:
        await anonymous.close()
    await page.close()
