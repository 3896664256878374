"""bash in the running bot: /status lists a conversation's background jobs, /readyz shows the
sandbox (or why there is none), and a stop kills the jobs and records it on the tape."""

from __future__ import annotations

import aiohttp

from bub_bot.server import Bot, BotServer
from channels.cli import CliChannel
from tests.fakes.openai_server import text, tool_calls
from tests.test_mcp import say


async def test_status_lists_jobs_and_a_stop_records_them(fake_openai, settings) -> None:
    channel = CliChannel()
    bot = await Bot.open(settings(), [channel])
    server = BotServer(bot, host="127.0.0.1", port=0)
    await server.start()
    stopped = False
    try:
        fake_openai.script(
            tool_calls([("bash", {"cmd": "sleep 600", "background": True})]), text("started")
        )
        assert await say(bot, channel, "start a job", session="jobs") == "started"
        status = await say(bot, channel, "/status", session="jobs")
        assert "Background jobs (1):" in status and "running" in status and "sleep 600" in status
        other = await say(bot, channel, "/status", session="other")
        assert "Background jobs: none" in other
        async with aiohttp.ClientSession() as http, http.get(server.url + "/readyz") as resp:
            ready = await resp.json()
        assert ready["bash"] == {"sandbox": "bwrap"}
        (job,) = bot.agent.shell.jobs.jobs.values()
        tape = job.tape
        await server.stop()
        stopped = True
    finally:
        if not stopped:
            await server.stop()
    # The store is closed: read the tape again from the file.
    from bub_bot.tape import SQLiteTapeStore

    store = await SQLiteTapeStore.open(bot.store.path)
    try:
        found = await store.query(tape.name, kinds=["event"], names=["bash.job"])
    finally:
        await store.close()
    assert [e.payload["data"]["state"] for e in found] == ["running", "stopped_by_shutdown"]


async def test_readyz_says_why_bash_is_missing(fake_openai, settings) -> None:
    bot = await Bot.open(settings(tools=["tape", "fs"]), [])
    server = BotServer(bot, host="127.0.0.1", port=0)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http, http.get(server.url + "/readyz") as resp:
            ready = await resp.json()
        assert ready["bash"]["sandbox"] == "unavailable"
        assert "BUB_TOOLS does not list bash" in ready["bash"]["why"]
    finally:
        await server.stop()
