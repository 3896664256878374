"""The login cookie: `Secure` behind a trusted TLS-terminating proxy (and only then, or when
the operator says the public URL is https), and a server-side expiry."""

from __future__ import annotations

import aiohttp

from channels.web.auth import COOKIE
from tests.test_web import TOKEN, status_of, web

__all__ = ["web"]  # fixture


async def _login(url: str, headers: dict[str, str] | None = None) -> str:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        status, _, got = await status_of(
            browser, "GET", f"{url}/?token={TOKEN}", headers=headers or {}
        )
        assert status == 303
        return got["Set-Cookie"]


async def test_secure_behind_a_trusted_proxy_only(web) -> None:
    w = await web()  # the test client connects from 127.0.0.1: a trusted proxy by default
    assert "Secure" in await _login(w.url, {"X-Forwarded-Proto": "https"})
    assert "Secure" not in await _login(w.url, {"X-Forwarded-Proto": "http"})
    assert "Secure" not in await _login(w.url)
    stranger = await web(trusted_proxies="10.0.0.0/8")  # loopback no longer trusted
    assert "Secure" not in await _login(stranger.url, {"X-Forwarded-Proto": "https"})
    public_https = await web(trusted_proxies="10.0.0.0/8", web_cookie_secure=True)
    assert "Secure" in await _login(public_https.url)


async def test_the_cookie_expires_on_the_server(web) -> None:
    w = await web(web_login_max_age_seconds=3600)
    cookie = (await _login(w.url)).split(";")[0].split("=", 1)[1]
    assert "Max-Age=3600" in await _login(w.url)
    access = w.channel.access
    assert access.cookie_ok(cookie)
    async with aiohttp.ClientSession() as http:
        headers = {"Cookie": f"{COOKIE}={cookie}"}
        status, _, _ = await status_of(http, "GET", w.url + "/api/conversations", headers=headers)
        assert status == 200
        # The same cookie an hour and a bit later (a leaked one does not stay valid).
        now = access.clock()
        access.clock = lambda: now + 3601
        status, _, _ = await status_of(http, "GET", w.url + "/api/conversations", headers=headers)
        assert status == 401
        forged = f"{int(now) + 3000}.{cookie.split('.', 1)[1]}"  # a later time, old MAC
        assert not access.cookie_ok(forged)
        headers = {"Cookie": f"{COOKIE}={forged}"}
        status, _, _ = await status_of(http, "GET", w.url + "/api/conversations", headers=headers)
        assert status == 401


async def test_event_streams_per_client_are_bounded(web) -> None:
    from tests.web_client import WebChat

    w = await web(web_max_streams_per_client=3)
    async with aiohttp.ClientSession() as http:
        chat = WebChat(http, w.url, TOKEN)
        conversation = await chat.new_conversation()
        streams = [await chat.events(conversation) for _ in range(3)]
        url = f"{w.url}/api/conversations/{conversation}/events"
        status, body, _ = await status_of(http, "GET", url, headers=chat.headers)
        assert status == 429 and "BUB_WEB_MAX_STREAMS_PER_CLIENT" in body
        # Another client (here: a bearer of another address would) is not affected, and the
        # count is per client: the slots come back as the streams end (at their next write).
        assert w.channel.chat.streams == {"127.0.0.1": 3}
        for stream in streams:
            await stream.close()
