"""Slow and idle HTTP clients are bounded: a slowloris attack does not stop the server."""

from __future__ import annotations

import asyncio

import aiohttp

from bub_bot.http_limits import ConnectionGuard
from bub_bot.server import Bot, BotServer
from channels.cli import CliChannel
from tests.slowloris import Slowloris


async def _server(settings, **limits) -> BotServer:
    bot = await Bot.open(settings(**limits), [CliChannel()])
    server = BotServer(bot, host="127.0.0.1", port=0)
    await server.start()
    return server


async def _healthz(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url + "/healthz", timeout=aiohttp.ClientTimeout(total=20)) as resp:
        return resp.status


async def test_health_checks_answer_under_300_slowloris_connections(settings) -> None:
    server = await _server(settings, http_max_connections=100, http_header_timeout_seconds=2.0)
    attack = Slowloris("127.0.0.1", server.port, n=300, every=0.2)
    try:
        await attack.start()
        await asyncio.sleep(0.5)
        # More attackers than connections allowed: the guard never holds more than its cap.
        assert len(server.guard.conns) <= 100
        async with aiohttp.ClientSession() as http:
            for _ in range(20):
                assert await _healthz(http, server.url) == 200
                assert len(server.guard.conns) <= 100
                await asyncio.sleep(0.1)
        # Unfinished headers are cut after the header timeout: every attacker gets closed.
        for _ in range(200):
            if attack.closed >= 300:
                break
            await asyncio.sleep(0.05)
        assert attack.closed >= 300
    finally:
        await attack.stop()
        await server.stop()


async def test_a_slow_body_and_an_idle_keep_alive_are_closed(settings) -> None:
    server = await _server(settings, http_body_timeout_seconds=1.0, http_idle_timeout_seconds=1.0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nab")
        await writer.drain()
        await asyncio.wait_for(reader.read(), 30)  # returns once the server closed it
        assert reader.at_eof()
        writer.close()
        # A finished request on a kept-alive connection: closed once idle too long.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(b'{"ok": true}'), 10)
        assert first.startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(reader.read(), 30) == b""
        writer.close()
    finally:
        await server.stop()


def test_the_connection_cap_leaves_room_under_the_descriptor_limit() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    guard = ConnectionGuard(max_connections=10**6)
    assert guard.max_connections <= resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 100
    assert ConnectionGuard(max_connections=50).max_connections == 50
    assert soft <= resource.getrlimit(resource.RLIMIT_NOFILE)[0]
