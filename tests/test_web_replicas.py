"""The web chat on several replicas (one PostgreSQL database, two servers in this process): a
page connected to one replica follows a turn that runs on another at once, through the
runtime's broadcasts (PostgreSQL NOTIFY), not through its keepalive re-read. Below it, the
broadcasts of the lease store themselves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bub_bot.config import Settings
from bub_bot.server import Bot, BotServer
from bub_bot.tape import open_store
from bub_bot.tape.leases import MAX_BROADCAST, LeaseKey, LocalLeases
from channels.web import WebChannel, chat
from tests.fakes.openai_server import FakeOpenAI, streamed, text
from tests.runtime_channel import until
from tests.web_client import WebChat, has_item, items

TOKEN = "web-replicas-token-0123456789"


@pytest.fixture
async def replica(
    settings: Callable[..., Settings], pg_url: str
) -> AsyncIterator[Callable[[], Awaitable[tuple[BotServer, WebChat]]]]:
    """`await replica()`: one more `serve` (web chat only) on the shared test database."""
    started: list[BotServer] = []
    http = aiohttp.ClientSession()

    async def start() -> tuple[BotServer, WebChat]:
        conf = settings(web_token=TOKEN, database_url=pg_url)
        server = BotServer(await Bot.open(conf, [WebChannel(conf)]), host="127.0.0.1", port=0)
        await server.start()
        started.append(server)
        return server, WebChat(http, server.url, TOKEN)

    yield start
    for server in started:
        await server.stop()
    await http.close()


async def test_a_page_on_one_replica_follows_a_turn_run_by_another(
    replica, fake_openai: FakeOpenAI, monkeypatch
) -> None:
    # Only a broadcast can wake the page on A: its keepalive re-read would come in 5 minutes.
    monkeypatch.setattr(chat, "KEEPALIVE_SECONDS", 300.0)
    (a, page_side), (b, post_side) = await replica(), await replica()
    assert a.bot.runtime.leases.owner != b.bot.runtime.leases.owner
    conversation = await page_side.new_conversation()
    stream = await page_side.events(conversation)
    try:
        assert (await stream.next()).event == "sync"
        assert (await stream.next()).event == "working"
        answer = "The answer, written on **replica B**, " + "word " * 40
        fake_openai.script(streamed(text(answer), chunks=20, seconds=1.5))
        # Posted through B: B stores it and runs the turn; A never hears of it locally.
        status, _ = await post_side.post(conversation, "hello from a page", client_id="msg-0001")
        assert status == 202
        await stream.until(lambda e: e.event == "working" and e.data["working"], timeout=5)
        # B's partial answer reaches A's page while the model still writes.
        shown = await stream.until(lambda e: e.event == "partial" and e.data["html"], timeout=5)
        assert shown.data["html"].startswith("<p>The answer,")
        final = await stream.until(has_item("bot"), timeout=5)
        [bot] = [i for i in final.data["items"] if i["kind"] == "bot"]
        assert "<strong>replica B</strong>" in bot["html"]
        await stream.until(lambda e: e.event == "working" and not e.data["working"], timeout=5)
        assert [i["client_id"] for i in items(stream.seen, "user")] == ["msg-0001"]
    finally:
        await stream.close()
    # A ran nothing: its hub only ever knew what B told it, and that is over now.
    assert a.bot.runtime.lease_keeper.held == 0 and a.bot.runtime.running_turns == 0
    assert len(fake_openai.completion_requests()) == 1
    web_a = a.bot.channels[0]
    assert isinstance(web_a, WebChannel)
    assert not web_a.hub.busy(conversation) and web_a.hub.partial(conversation) is None
    # A page loading on A now sees the answer from the tape, with no partial left behind.
    code, snap = await page_side.get_json(f"/api/conversations/{conversation}/messages")
    assert code == 200 and snap["working"] is False and snap["partial"] is None
    assert [i["kind"] for i in snap["items"]][-2:] == ["user", "bot"]


async def test_broadcasts_reach_the_other_processes_subscribed_to_their_topic(
    pg_url: str,
) -> None:
    async with open_store(pg_url) as store:
        one, two, three = (store.leases(o, 15) for o in ("one", "two", "three"))
        heard: dict[str, list[Any]] = {"one": [], "two": [], "three": [], "handover": []}
        try:
            for lease in (one, two, three):
                await lease.listen(heard["handover"].append)
            one.subscribe("web", heard["one"].append)
            two.subscribe("web", heard["two"].append)
            three.subscribe("other", heard["three"].append)
            data = '{"c": "conversation-1"}\nsecond line, ünïcode'
            await one.broadcast("web", data)
            await until(lambda: heard["two"] == [data])
            # Not back to the sender, not to another topic, never taken for a handover.
            await one.release(LeaseKey("tape-x", "test:x"), handover=True)
            await until(lambda: len(heard["handover"]) == 2)
            assert heard["one"] == [] and heard["three"] == []
            assert heard["handover"] == [LeaseKey("tape-x", "test:x")] * 2
            # The notice's limit is the caller's error, said before anything is sent.
            with pytest.raises(ValueError, match="too long"):
                await one.broadcast("web", "x" * MAX_BROADCAST)
            with pytest.raises(ValueError, match="one word"):
                await one.broadcast("two words", "x")
            await one.broadcast("web", "x" * (MAX_BROADCAST - 3))
            await until(lambda: len(heard["two"]) == 2)
        finally:
            for lease in (one, two, three):
                await lease.close()


async def test_a_single_process_broadcasts_nothing() -> None:
    local = LocalLeases()
    heard: list[str] = []
    local.subscribe("web", heard.append)
    await local.broadcast("web", "anything")
    await asyncio.sleep(0)
    assert heard == []


async def test_broadcasts_are_not_heard_by_a_listener_for_handovers_only(pg_url: str) -> None:
    """A replica of the previous release listens on the handover channel only: broadcasts
    (which may carry partial answers) go on a channel of their own, so during a rolling deploy
    it neither logs them nor mistakes them for anything (found in review)."""
    import asyncpg

    async with open_store(pg_url) as store:
        lease = store.leases("new", 15)
        old_style = await asyncpg.connect(pg_url)
        heard: list[str] = []
        try:
            await old_style.add_listener(await lease.channel(), lambda *a: heard.append(a[3]))
            await lease.broadcast("web", '{"c": "conversation-1", "p": ["private text", ""]}')
            await lease.release(LeaseKey("tape-y", "test:y"), handover=True)
            await until(lambda: len(heard) == 1)
            await asyncio.sleep(0.2)
            assert len(heard) == 1 and "private text" not in heard[0]
        finally:
            await old_style.close()
            await lease.close()
