"""The web chat and the tape viewer over real HTTP: `BotServer` in-process on loopback, the
web channel on the real runtime, store and agent, the fake model behind it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

import aiohttp
import pytest

from bub_bot.agent.prompt import build_system_prompt
from bub_bot.config import MODEL_MISSING, ConfigError, Settings, load_settings
from bub_bot.server import Bot, BotServer
from bub_bot.tape import Tape
from channels.web import WebChannel
from channels.web.hub import Hub
from channels.web.render import markdown
from channels.web.stream import WebStream
from tests.fakes.openai_server import FakeOpenAI, slow, streamed, text, tool_calls
from tests.web_client import WebChat, has_item, items, partials

TOKEN = "web-test-token-0123456789"


@dataclass
class Web:
    """A started bot with the web channel, and a client for it."""

    server: BotServer
    bot: Bot
    channel: WebChannel
    http: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def chat(self) -> WebChat:
        return WebChat(self.http, self.url, TOKEN)

    def tape(self, conversation: str) -> Tape:
        return Tape.for_session(self.bot.store, f"web:{conversation}", self.bot.settings.workspace)

    async def idle(self, conversation: str) -> None:
        await self.bot.runtime.wait_idle(f"web:{conversation}", timeout=15)


@pytest.fixture
async def web(settings: Callable[..., Settings]) -> AsyncIterator[Callable[..., Awaitable[Web]]]:
    """`await web(**settings_overrides)`: a started server with the web channel only."""
    started: list[Web] = []
    # unsafe=True: keep cookies for 127.0.0.1 (aiohttp drops cookies of IP hosts by default).
    http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))

    async def start(**overrides: Any) -> Web:
        conf = settings(**{"web_token": TOKEN, **overrides})
        channel = WebChannel(conf)
        bot = await Bot.open(conf, [channel])
        server = BotServer(bot, host="127.0.0.1", port=0)
        await server.start()
        made = Web(server, bot, channel, http)
        started.append(made)
        return made

    yield start
    for made in started:
        await made.server.stop()
    await http.close()


async def status_of(
    http: aiohttp.ClientSession, method: str, url: str, **kw: Any
) -> tuple[int, str, dict]:
    async with http.request(method, url, allow_redirects=False, **kw) as resp:
        return resp.status, await resp.text(), dict(resp.headers)


# -- chat --------------------------------------------------------------------------------------
async def test_a_retried_message_is_stored_and_answered_once(web, fake_openai: FakeOpenAI) -> None:
    w = await web()
    chat = w.chat
    conversation = await chat.new_conversation()
    fake_openai.script(slow(text("the one answer"), 0.3))
    first = await chat.post(conversation, "hello", client_id="client-msg-1")
    again = await chat.post(conversation, "hello", client_id="client-msg-1")
    assert first == (202, {"stored": True, "duplicate": False, "entry_id": first[1]["entry_id"]})
    assert again[0] == 200 and again[1]["duplicate"] is True
    await w.idle(conversation)
    tape = w.tape(conversation)
    assert len(await tape.query(kinds=["message"], names=["user"])) == 1
    assert len(fake_openai.completion_requests()) == 1
    answers = [e for e in await tape.query(kinds=["message"], names=["assistant"])]
    assert [a.payload["content"] for a in answers] == ["the one answer"]


async def test_the_event_stream_shows_the_answer_working_and_resumes(
    web, fake_openai, store_url: str
) -> None:
    w = await web(database_url=store_url)
    chat = w.chat
    conversation = await chat.new_conversation()
    stream = await chat.events(conversation)
    try:
        first = await stream.next()
        assert first.event == "sync" and first.data["items"] == []
        fake_openai.script(slow(text("**bold** answer"), 0.3))
        await chat.post(conversation, "question one", client_id="question-1")
        await stream.until(lambda e: e.event == "working" and e.data["working"])
        answer = await stream.until(has_item("bot"))
        [bot] = [i for i in answer.data["items"] if i["kind"] == "bot"]
        assert bot["html"] == "<p><strong>bold</strong> answer</p>\n"
        await stream.until(lambda e: e.event == "working" and not e.data["working"])
        [user] = items(stream.seen, "user")
        assert user["client_id"] == "question-1" and "question one" in user["html"]
        last_id = stream.last_id
    finally:
        await stream.close()

    # Reconnecting with Last-Event-ID: only what came after, nothing twice.
    fake_openai.script(text("second answer"))
    await chat.post(conversation, "question two", client_id="question-2")
    await w.idle(conversation)
    stream = await chat.events(conversation, last_id=last_id)
    try:
        update = await stream.until(has_item("bot"))
        assert update.event == "entries"
        assert [i["client_id"] for i in items([update], "user")] == ["question-2"]
        assert "second answer" in items([update], "bot")[0]["html"]
        # /reset clears the tape (ids restart): the stream sends a fresh `sync`
        await chat.post(conversation, "/reset", client_id="reset-cmd-1")
        synced = await stream.until(lambda e: e.event == "sync")
        kinds = [i["kind"] for i in synced.data["items"]]
        assert kinds[0] == "anchor" and "archived" in synced.data["items"][0]["html"]
        if not any("fresh conversation" in i["html"] for i in items([synced], "bot")):
            await stream.until(
                lambda e: any("fresh conversation" in i["html"] for i in items([e], "bot"))
            )
    finally:
        await stream.close()

    # A page loading now sees the conversation since the last anchor (JSON snapshot).
    await w.idle(conversation)
    status, snap = await chat.get_json(f"/api/conversations/{conversation}/messages")
    assert status == 200 and snap["working"] is False and snap["partial"] is None
    assert [i["kind"] for i in snap["items"]][:1] == ["anchor"]
    assert not any("question one" in i["html"] for i in snap["items"])


async def test_the_conversation_list_shows_web_conversations_newest_first(web) -> None:
    w = await web()
    chat = w.chat
    first, second = await chat.new_conversation(), await chat.new_conversation()
    assert first != second
    await chat.post(first, "the  first\nconversation")
    await w.idle(first)
    await chat.post(second, "/handoff the second one")
    await chat.post(second, "hello again")
    await w.idle(second)
    other = Tape.for_session(w.bot.store, "cli:local", w.bot.settings.workspace)
    await other.append_message({"role": "user", "content": "not a web conversation"})
    status, listing = await chat.get_json("/api/conversations")
    assert status == 200 and listing["model_configured"] is True
    rows = listing["conversations"]
    assert [r["id"] for r in rows] == [second, first]
    # titles: the first message a person sent (not a command, not a handoff summary)
    assert [r["title"] for r in rows] == ["hello again", "the first conversation"]


async def test_one_conversation_reads_as_its_row_of_the_list(web) -> None:
    """What the page reads after new entries: the one conversation, the same row the whole
    list gives it; 404 while nothing is stored (and for an id that is not one)."""
    w = await web()
    chat = w.chat
    first, second = await chat.new_conversation(), await chat.new_conversation()
    assert (await chat.get_json(f"/api/conversations/{first}"))[0] == 404
    assert (await chat.get_json("/api/conversations/bad!id"))[0] == 404
    await chat.post(first, "the  first\nconversation")
    await chat.post(second, "another one")
    await w.idle(first)
    await w.idle(second)
    _, listing = await chat.get_json("/api/conversations")
    status, row = await chat.get_json(f"/api/conversations/{first}")
    assert status == 200 and row["title"] == "the first conversation"
    assert row == next(r for r in listing["conversations"] if r["id"] == first)


async def test_commands_work_from_the_web(web, fake_openai) -> None:
    w = await web()
    chat = w.chat
    conversation = await chat.new_conversation()
    fake_openai.script(text("hi there"), text("We greeted each other."))
    await chat.post(conversation, "hello")
    await w.idle(conversation)
    await chat.post(conversation, "/handoff")
    await w.idle(conversation)
    await chat.post(conversation, "/status")
    await w.idle(conversation)
    _, snap = await chat.get_json(f"/api/conversations/{conversation}/messages")
    kinds = [i["kind"] for i in snap["items"]]
    assert kinds[0] == "anchor" and "We greeted each other." in snap["items"][0]["html"]
    assert any("Entries:" in i["html"] for i in snap["items"] if i["kind"] == "bot")


async def test_model_output_is_escaped_not_rendered(web, fake_openai) -> None:
    w = await web()
    chat = w.chat
    conversation = await chat.new_conversation()
    evil = (
        '<script>window.pwned = 1</script>\n\n<img src=x onerror="window.pwned = 2">\n\n'
        "[click](javascript:alert(1)) and ![pixel](http://tracker.example/p.png)"
    )
    fake_openai.script(text(evil))
    await chat.post(conversation, "<b>user html</b>")
    await w.idle(conversation)
    _, snap = await chat.get_json(f"/api/conversations/{conversation}/messages")
    [bot] = [i for i in snap["items"] if i["kind"] == "bot"]
    html = bot["html"]
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;" in html and "&lt;img src=x onerror=" in html
    assert 'href="javascript:' not in html
    assert '<a href="http://tracker.example/p.png"' in html  # an image becomes a link
    [user] = [i for i in snap["items"] if i["kind"] == "user"]
    assert "&lt;b&gt;user html&lt;/b&gt;" in user["html"]


async def test_bad_requests_get_clear_errors_and_store_nothing(web, fake_openai) -> None:
    w = await web()
    http = w.http
    headers = {"Authorization": f"Bearer {TOKEN}"}
    url = w.url + "/api/conversations/abcdefgh/messages"
    json_type = {"Content-Type": "application/json"}
    bogus_charset = {"Content-Type": "application/json; charset=bogus"}
    cases = [
        ({"json": {"text": "", "client_id": "abcdefgh1"}}, 400, "empty"),
        ({"json": {"text": "hi", "client_id": "bad id!"}}, 400, "client_id"),
        ({"json": {"text": "hi", "client_id": "abcdefgh1\n"}}, 400, "client_id"),
        ({"json": {"text": 5, "client_id": "abcdefgh1"}}, 400, "text"),
        ({"json": ["not", "an", "object"]}, 400, "object"),
        ({"data": b"{not json", "headers": {"Content-Type": "application/json"}}, 400, "JSON"),
        (
            {"data": b'{"text": "\xff", "client_id": "abcdefgh1"}', "headers": json_type},
            400,
            "JSON",
        ),
        (
            {"json": {"text": "hi", "client_id": "abcdefgh1"}, "headers": bogus_charset},
            400,
            "charset",
        ),
        ({"json": {"text": "x" * 100_001, "client_id": "abcdefgh1"}}, 413, "longer"),
    ]
    for kwargs, status, word in cases:
        kwargs["headers"] = {**headers, **kwargs.get("headers", {})}
        got, body, _ = await status_of(http, "POST", url, **kwargs)
        assert got == status and word in json.loads(body)["error"], (kwargs, got, body)
    message = {"text": "hi", "client_id": "abcdefgh1"}
    for method, path in [
        ("GET", "/api/conversations/bad!id/events"),
        # `$` matches before a final newline: an id `abcdefgh\n` must not become a session
        ("POST", "/api/conversations/abcdefgh%0A/messages"),
        ("GET", "/api/conversations/abcdefgh%0A/messages"),
        ("GET", "/api/conversations/abcdefgh%0A/events"),
    ]:
        got, _, _ = await status_of(http, method, w.url + path, headers=headers, json=message)
        assert got == 404, path
    for path, status in [
        ("/tapes/no_such_tape?format=json", 404),
        ("/tapes/..%2Fetc?format=json", 404),
        ("/tapes?page=zero&format=json", 400),
    ]:
        got, _, _ = await status_of(http, "GET", w.url + path, headers=headers)
        assert got == status, path
    assert await w.bot.store.list_tapes(include_all=True) == []
    assert fake_openai.completion_requests() == []


async def test_without_a_model_the_page_and_the_answer_say_what_to_set(
    web, fake_openai: FakeOpenAI
) -> None:
    w = await web(openai_api_key=None, openai_base_url=None, require_model=False)
    async with w.http.get(w.url + "/", headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
        page = await resp.text()
    for words in ("OPENAI_API_KEY", "OPENAI_BASE_URL", ".env.example", "Ollama"):
        assert words in page
    conversation = await w.chat.new_conversation()
    await w.chat.post(conversation, "hello?")
    await w.idle(conversation)
    _, snap = await w.chat.get_json(f"/api/conversations/{conversation}/messages")
    [notice] = [i for i in snap["items"] if i["kind"] == "notice"]
    assert "OPENAI_API_KEY" in notice["html"] and ".env" in notice["html"]
    notices = await w.tape(conversation).query(kinds=["event"], names=["turn.notice"])
    assert notices[0].payload["data"]["text"] == MODEL_MISSING
    assert fake_openai.requests == []  # no model call, not even to the fake


STREAMED = (
    "Streaming, **step by step**: <script>window.pwned = 1</script> and"
    ' <img src=x onerror="window.pwned = 2"> stay text.\n\n'
    "```python\nprint('a code block written slowly')\nprint('still open')\n```\n\nDone."
)


class Balance(HTMLParser):
    """Fails on markup that leaves a tag open or closes one that is not open."""

    VOID = frozenset({"br", "hr", "img", "input", "meta", "link"})

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open.pop() == tag, tag


def balanced(html: str) -> bool:
    parser = Balance()
    parser.feed(html)
    parser.close()
    return parser.open == []


async def test_the_answer_streams_to_the_page_then_the_final_replaces_it(
    web, fake_openai: FakeOpenAI
) -> None:
    w = await web()
    conversation = await w.chat.new_conversation()
    fake_openai.script(
        streamed(tool_calls([("tape_info", {})], content="Let me look."), seconds=0.3),
        streamed(text(STREAMED), chunks=20, seconds=1.2),
    )
    stream = await w.chat.events(conversation)
    late = None
    try:
        await stream.until(lambda e: e.event == "working")
        await w.chat.post(conversation, "stream it")
        first = await stream.until(lambda e: e.event == "partial" and "Streaming" in e.data["html"])
        # A page that connects mid-answer gets the answer so far right after the history.
        late = await w.chat.events(conversation)
        opening = [await late.next() for _ in range(3)]
        assert [e.event for e in opening] == ["sync", "working", "partial"]
        assert opening[1].data["working"] is True and "Streaming" in opening[2].data["html"]
        _, snap = await w.chat.get_json(f"/api/conversations/{conversation}/messages")
        assert snap["working"] is True and "Streaming" in snap["partial"]["html"]
        final = await stream.until(has_item("bot"))
        await stream.until(lambda e: e.event == "working" and not e.data["working"])
        await late.until(has_item("bot"))
    finally:
        await stream.close()
        if late is not None:
            await late.close()
    await w.idle(conversation)

    seen = stream.seen
    before = partials(seen[: seen.index(final)])
    after = partials(seen[seen.index(final) :])
    # The tool step shows what the bot does, not its text or the tool's JSON.
    assert {"html": "", "status": "using tape_info…"} in [e.data for e in before]
    texts = [e.data["html"] for e in before if "Streaming" in e.data["html"]]
    log = fake_openai.streams[-1]
    assert len(texts) >= 3 and first.at < log.last  # text grows while the model writes
    assert len(texts) <= (log.last - log.first) / 0.1 + 2  # 100 ms apart at most by default
    # Every partial is the server's render of a prefix of the answer: no raw HTML, and a
    # code block still being written is closed in the markup.
    prefixes = {markdown(STREAMED[:n]) for n in range(len(STREAMED) + 1)}
    for html in texts:
        assert html in prefixes and balanced(html)
        assert "<script" not in html and "<img" not in html
    assert any("<pre><code" in html and "still open" not in html for html in texts)
    # The final answer is the model's answer; the partial is taken away once it is there.
    [bot] = [i for i in final.data["items"] if i["kind"] == "bot"]
    assert bot["answer"] is True and bot["html"] == markdown(STREAMED)
    assert [e.data for e in after] == [{"html": "", "status": ""}]
    # Nothing partial is on the tape: the answer once, no stream records (a page keeps
    # nothing across a restart).
    tape = w.tape(conversation)
    answers = await tape.query(kinds=["message"], names=["assistant"])
    assert answers[-1].payload["content"] == STREAMED
    assert await tape.query(kinds=["event"], names=["stream.shown", "stream.closed"]) == []


async def test_stream_off_gives_the_final_text_only(web, fake_openai: FakeOpenAI) -> None:
    w = await web(stream=False)
    conversation = await w.chat.new_conversation()
    fake_openai.script(streamed(text(STREAMED), chunks=10, seconds=0.4))
    stream = await w.chat.events(conversation)
    try:
        await stream.until(lambda e: e.event == "working")
        await w.chat.post(conversation, "do not stream")
        final = await stream.until(has_item("bot"))
        await stream.until(lambda e: e.event == "working" and not e.data["working"])
    finally:
        await stream.close()
    assert partials(stream.seen) == []
    assert items([final], "bot")[0]["html"] == markdown(STREAMED)
    assert fake_openai.completion_requests()[-1].body.get("stream") is not True


async def test_a_long_answer_is_updated_less_often_than_a_short_one() -> None:
    """Each update renders the whole text again: after a costly render the stream holds the
    next text back (the runtime offers it again) instead of rendering all the time."""
    hub = Hub()
    stream = WebStream(hub, "conversation-1")
    paragraph = "Some **bold** words, a `span` and [a link](https://example.org). " * 8
    long = "\n\n".join([paragraph] * 300)  # about 150 KB
    with hub.subscribe("conversation-1") as page:
        assert await stream.update("short") is True
        assert page.partial is not None and page.partial.text == "short"
        assert await stream.update(long) is True  # nobody rendered "short": no cost yet
        assert page.partial is not None and page.partial.text == long
        page.partial.payload()  # a page renders it: that took a while
        assert await stream.update(long + " more") is False
        assert page.partial.text == long  # still the last one shown
        await stream.status("using fs.read…")  # a status is cheap: never held back
        assert page.partial.status == "using fs.read…"
        assert await stream.end(1) == []
        assert page.partial is not None and page.partial.payload() == {"html": "", "status": ""}
        assert hub.partial("conversation-1") is None


async def test_stop_ends_open_event_streams(web) -> None:
    w = await web()
    conversation = await w.chat.new_conversation()
    stream = await w.chat.events(conversation)
    await stream.until(lambda e: e.event == "working")
    stop = asyncio.ensure_future(w.server.stop())
    with pytest.raises((EOFError, aiohttp.ClientError)):
        await stream.next(timeout=5)
    await asyncio.wait_for(stop, 10)  # not held up by the stream
    await stream.close()


# -- viewer ------------------------------------------------------------------------------------
async def _viewer_conversation(w: Web, fake_openai: FakeOpenAI) -> str:
    """A web conversation with a spilled tool output, a /handoff, then a message after it."""
    conversation = await w.chat.new_conversation()
    fake_openai.script(
        tool_calls([("tape_info", {})]),
        text("spilled and answered"),
        text("Summary: we looked at the tape."),
        text("after the handoff"),
    )
    for message in ("look at the tape", "/handoff", "what now?"):
        await w.chat.post(conversation, message)
        await w.idle(conversation)
    return conversation


async def test_viewer_lists_pages_and_filters_tapes(web, fake_openai, store_url: str) -> None:
    """On every store: SQLite and PostgreSQL."""
    w = await web(spill_threshold=10, database_url=store_url)
    conversation = await _viewer_conversation(w, fake_openai)
    session = f"web:{conversation}"
    chat = w.chat
    _, listing = await chat.get_json("/tapes")
    [row] = listing["tapes"]
    assert row["session_id"] == session and row["channel"] == "web"
    assert row["anchors"] == 2 and row["entries"] > 10
    assert (await chat.get_json("/tapes?channel=slack"))[1]["tapes"] == []
    assert (await chat.get_json(f"/tapes?q={conversation[:5].upper()}"))[1]["total"] == 1
    assert (await chat.get_json("/tapes?q=nobody"))[1]["total"] == 0

    name = row["name"]
    _, view = await chat.get_json(f"/tapes/{name}")
    stats = view["stats"]
    assert [e["id"] for e in view["entries"]] == list(
        range(stats["last_anchor_id"] + 1, stats["entries"] + 1)
    )
    assert [a["name"] for a in view["anchors"]] == ["session/start", "handoff"]
    assert view["anchors"][1]["state"]["summary"] == "Summary: we looked at the tape."
    [spilled] = view["spills"]
    assert spilled["tool"] == "tape_info"

    # "all", paginated newest first, older pages by cursor; filter by kind
    _, page1 = await chat.get_json(f"/tapes/{name}?view=all&per=5")
    assert [e["id"] for e in page1["entries"]] == list(
        range(stats["entries"] - 4, stats["entries"] + 1)
    )
    _, page2 = await chat.get_json(page1["older"])
    assert page2["entries"][-1]["id"] == page1["entries"][0]["id"] - 1
    _, anchors_only = await chat.get_json(f"/tapes/{name}?view=all&kind=anchor")
    assert {e["kind"] for e in anchors_only["entries"]} == {"anchor"}
    assert (await chat.get_json(f"/tapes/{name}?kind=nonsense"))[0] == 400

    # the spilled output, page by page
    _, out = await chat.get_json(f"/tapes/{name}/spill/{spilled['handle']}")
    assert out["page"] == 0 and out["pages"] >= 1 and out["content"]
    assert (await chat.get_json(f"/tapes/{name}/spill/sp_unknown"))[0] == 404

    # HTML: context=False marked, tool calls with arguments and results, safe rendering
    async with w.http.get(f"{w.url}/tapes/{name}?view=all", headers=chat.headers) as resp:
        html = await resp.text()
    assert resp.status == 200
    assert "not in context" in html and "tape_info" in html and "Spilled outputs" in html

    # after /reset the archive is listed with the session and viewable
    await chat.post(conversation, "/reset")
    await w.idle(conversation)
    _, view = await chat.get_json(f"/tapes/{name}")
    [archive] = view["archives"]
    _, archived = await chat.get_json(f"/tapes/{archive['name']}?view=all")
    assert archived["role"] == "archive" and archived["stats"]["anchors"] == 2
    _, archived_spill = await chat.get_json(f"/tapes/{archive['name']}/spill/{spilled['handle']}")
    assert archived_spill["content"] == out["content"]


async def test_context_now_is_what_the_next_model_call_gets(web, fake_openai) -> None:
    w = await web(spill_threshold=10)
    conversation = await _viewer_conversation(w, fake_openai)
    name = w.tape(conversation).name
    _, ctx = await w.chat.get_json(f"/tapes/{name}/context")
    assert ctx["estimated_tokens"]["messages"] > 0 and "tape_info" in ctx["tools"]
    fake_openai.script(text("ok"))
    await w.chat.post(conversation, "one more")
    await w.idle(conversation)
    sent = fake_openai.last_messages()
    assert sent[:-1] == ctx["messages"]  # the same list, plus the new message
    assert sent[-1] == {"role": "user", "content": "one more"}
    assert ctx["messages"][0]["content"] == build_system_prompt(
        None, w.bot.settings.workspace, w.bot.agent.tools.visible()
    )
    async with w.http.get(f"{w.url}/tapes/{name}/context", headers=w.chat.headers) as resp:
        assert "Context now" in await resp.text()


async def test_the_viewer_can_be_turned_off(web) -> None:
    w = await web(web_viewer=False)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with w.http.get(w.url + "/tapes", headers=headers) as resp:
        assert resp.status == 404
    async with w.http.get(w.url + "/", headers=headers) as resp:
        assert resp.status == 200 and 'href="/tapes"' not in await resp.text()


def test_metrics_and_server_import_one_way() -> None:
    """server imports metrics; metrics never imports server (no cycle)."""
    from pathlib import Path

    source = (Path(__file__).parents[1] / "bub_bot" / "metrics.py").read_text()
    assert not re.search(r"^\s*from \.server import|^\s*import bub_bot\.server", source, re.M)


def test_serve_needs_a_model_unless_the_web_chat_is_the_only_channel(tmp_path) -> None:
    base = {"_env_file": None, "home": tmp_path, "openai_api_key": None, "openai_base_url": None}
    serve = {"require_model": True, "web_may_lack_model": True}
    assert load_settings(**serve, **base).web_only  # a fresh clone: starts, the page explains
    for extra in ({"telegram_token": "123:abc"}, {"web": False}):
        with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
            load_settings(**serve, **base, **extra)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        load_settings(require_model=True, **base)  # chat and run always need one
    with pytest.raises(ConfigError, match="BUB_WEB_TOKEN"):
        load_settings(require_model=False, web_token="short", **base)
    made = load_settings(require_model=False, **base).with_web_token()
    assert made.web_token_generated and len(made.web_token or "") >= 32
