"""Access to the web chat and the tape viewer: the token, its cookie, the login form, wrong
tokens limited per address, same-origin state changes. Real HTTP against `BotServer` on
loopback (the `web` fixture of tests/test_web.py)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import aiohttp

from channels.web.attempts import FailedAttempts, client_key
from tests.raw_http import send_raw
from tests.test_web import TOKEN, status_of, web

__all__ = ["web"]  # fixture


# -- access ------------------------------------------------------------------------------------
PAGES = ["/", "/tapes", "/tapes/abc__def", "/tapes/abc__def/context", "/tapes/abc__def/spill/sp_1"]
API = [
    ("GET", "/api/conversations"),
    ("POST", "/api/conversations"),
    ("GET", "/api/conversations/abcdefgh/messages"),
    ("POST", "/api/conversations/abcdefgh/messages"),
    ("GET", "/api/conversations/abcdefgh/events"),
]


async def test_every_page_and_api_answers_401_without_the_token(web) -> None:
    w = await web()
    async with aiohttp.ClientSession() as anon:
        for path in PAGES:
            status, body, headers = await status_of(anon, "GET", w.url + path)
            assert status == 401, path
            assert 'action="/login"' in body and "BUB_WEB_TOKEN" in body  # the login form
            assert "script-src 'self'" in headers["Content-Security-Policy"]
            status, body, _ = await status_of(anon, "GET", f"{w.url}{path}?token=wrong-token")
            assert status == 401 and "not valid" in body, path
        for method, path in API:
            status, body, _ = await status_of(
                anon, method, w.url + path, json={"text": "hi", "client_id": "abcdefgh12"}
            )
            assert status == 401 and json.loads(body)["error"] == "unauthorized", path
            status, _, _ = await status_of(
                anon, method, w.url + path, headers={"Authorization": "Bearer wrong"}
            )
            assert status == 401, path
        # health checks and the page's static files stay open; nothing was stored
        assert (await status_of(anon, "GET", w.url + "/healthz"))[0] == 200
        assert (await status_of(anon, "GET", w.url + "/static/chat.js"))[0] == 200
    assert await w.bot.store.list_tapes(include_all=True) == []


async def test_the_token_link_sets_a_strict_cookie_and_leaves_the_url(web) -> None:
    w = await web()
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as browser:
        status, _, headers = await status_of(browser, "GET", f"{w.url}/tapes?token={TOKEN}&page=1")
        assert status == 303
        assert headers["Location"] == "/tapes?page=1"  # the token is gone from the URL
        cookie = headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert TOKEN not in cookie  # the cookie is derived from the token, not the token
        assert headers["Referrer-Policy"] == "same-origin"
        status, body, headers = await status_of(browser, "GET", w.url + "/")
        assert status == 200 and 'src="/static/chat.js"' in body
        assert "<script>" not in body  # no inline script anywhere
        assert headers["Content-Security-Policy"].startswith("default-src 'none'")
        # the login form works too, and a wrong token there is 401
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as other:
            status, _, _ = await status_of(
                other, "POST", w.url + "/login", data={"token": "nope", "next": "/"}
            )
            assert status == 401
            status, _, headers = await status_of(
                other, "POST", w.url + "/login", data={"token": TOKEN, "next": "//evil.example/"}
            )
            assert status == 303 and headers["Location"] == "/"
            assert (await status_of(other, "GET", w.url + "/api/conversations"))[0] == 200


async def test_wrong_tokens_are_limited_per_address(web) -> None:
    """After 10 wrong tokens in a minute an address gets 429 with Retry-After for any token,
    right or wrong, on every way in; a logged-in browser and other addresses carry on."""
    w = await web()
    api = w.url + "/api/conversations"
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as browser:
        assert (await status_of(browser, "GET", f"{w.url}/?token={TOKEN}"))[0] == 303
        async with aiohttp.ClientSession() as guesser:
            for n in range(10):
                wrong = {"Authorization": f"Bearer guess-{n:04d}"}
                assert (await status_of(guesser, "GET", api, headers=wrong))[0] == 401
            right = {"Authorization": f"Bearer {TOKEN}"}
            status, body, headers = await status_of(guesser, "GET", api, headers=right)
            assert status == 429 and json.loads(body)["error"] == "too many failed attempts"
            assert 1 <= int(headers["Retry-After"]) <= 60
            status, body, headers = await status_of(guesser, "GET", f"{w.url}/?token={TOKEN}")
            assert status == 429 and "try again in" in body and "Retry-After" in headers
            status, body, headers = await status_of(
                guesser, "POST", w.url + "/login", data={"token": TOKEN, "next": "/"}
            )
            assert status == 429 and 'action="/login"' in body
            assert "Set-Cookie" not in headers  # the right token did not log it in
        # The browser that logged in before still works from the same address.
        assert (await status_of(browser, "GET", api))[0] == 200
    # Another address is not held up (127.0.0.2 is loopback too on Linux).
    other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=other) as elsewhere:
        status, _, _ = await status_of(
            elsewhere, "GET", api, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert status == 200


async def test_credentials_that_are_not_utf8_are_wrong_tokens(web, caplog) -> None:
    """A bearer token, cookie, token link or login form with bytes that are not UTF-8 (or
    text in an unknown charset) is a wrong token: 401, counted against the address like one
    (then 429); never a 500 with a traceback."""
    w = await web()
    caplog.set_level(logging.WARNING)
    form = b"Content-Type: application/x-www-form-urlencoded"
    counted = [  # (method, path, raw header lines, body)
        ("GET", "/api/conversations", [b"Authorization: Bearer \xff\xfe"], b""),
        ("GET", "/api/conversations", [b"Authorization: Bearer " + TOKEN.encode() + b"\xe9"], b""),
        ("GET", "/tapes", [b"Authorization: Bearer caf\xe9"], b""),
        ("POST", "/api/conversations/abcdefgh/messages", [b"Authorization: Bearer \xff"], b""),
        ("GET", "/?token=caf%E9", [], b""),
        ("POST", "/login", [form], b"token=\xff\xfe&next=/"),
        ("POST", "/login", [form + b"; charset=bogus"], b"token=nope&next=/"),
    ]
    stale_cookie = ("GET", "/api/conversations", [b"Cookie: bub_web=\xff\xfe"], b"")
    for method, path, headers, body in [stale_cookie, *counted]:
        status, _ = await send_raw(w.url, method, path, headers, body)
        assert status == 401, (path, headers, body)
    bad = [b"Authorization: Bearer \xff"]
    for _ in range(10 - len(counted)):
        assert (await send_raw(w.url, "GET", "/api/conversations", bad))[0] == 401
    right = [b"Authorization: Bearer " + TOKEN.encode()]
    assert (await send_raw(w.url, "GET", "/api/conversations", right))[0] == 429
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert await w.bot.store.list_tapes(include_all=True) == []


def test_failed_attempts_slide_out_of_the_window() -> None:
    now = [1000.0]
    attempts = FailedAttempts(limit=3, window=60, clock=lambda: now[0], max_clients=2)
    for _ in range(2):
        attempts.fail("198.51.100.7")
        now[0] += 10
    assert attempts.retry_after("198.51.100.7") == 0  # two of three
    attempts.fail("198.51.100.7")  # at 1020: the third
    assert attempts.retry_after("198.51.100.7") == 40  # the first (1000) leaves at 1060
    now[0] = 1059.5
    assert attempts.retry_after("198.51.100.7") == 1
    now[0] = 1060.0
    assert attempts.retry_after("198.51.100.7") == 0  # one slot free again
    attempts.fail("198.51.100.7")
    assert attempts.retry_after("198.51.100.7") == 10  # until 1010's failure leaves
    attempts.succeed("198.51.100.7")  # the right token forgives the mistakes
    assert attempts.retry_after("198.51.100.7") == 0
    # Memory stays bounded: the address not seen for longest is forgotten first.
    for key in ("a", "b", "c"):
        for _ in range(3):
            attempts.fail(key)
    assert [attempts.retry_after(k) > 0 for k in ("a", "b", "c")] == [False, True, True]


def test_client_key_groups_an_ipv6_host_by_its_64() -> None:
    def key(remote: str | None) -> str:
        return client_key(SimpleNamespace(remote=remote))  # type: ignore[arg-type]

    assert key("203.0.113.9") == "203.0.113.9"
    assert key("::ffff:203.0.113.9") == "203.0.113.9"
    assert key("2001:db8:1:2:aaaa::1") == key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert key("2001:db8:1:3::1") != key("2001:db8:1:2::1")
    assert key("/run/bub.sock") == "/run/bub.sock" and key(None) == ""


async def test_cross_site_posts_are_refused_and_store_nothing(web) -> None:
    w = await web()
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        await status_of(browser, "GET", f"{w.url}/?token={TOKEN}")
        body = {"text": "transfer everything", "client_id": "crosssite1"}
        url = w.url + "/api/conversations/abcdefgh/messages"
        for origin in ("http://evil.example", "null", "http://127.0.0.1:1"):
            status, _, _ = await status_of(
                browser, "POST", url, json=body, headers={"Origin": origin}
            )
            assert status == 403, origin
        status, _, _ = await status_of(
            browser, "POST", url, json=body, headers={"Sec-Fetch-Site": "cross-site"}
        )
        assert status == 403
        # a form post (what a cross-site page can send without CORS) is not accepted either
        status, _, _ = await status_of(
            browser, "POST", url, data={"text": "x", "client_id": "y" * 9}
        )
        assert status == 415
        status, _, _ = await status_of(
            browser,
            "POST",
            w.url + "/login",
            data={"token": TOKEN},
            headers={"Origin": "http://evil.example"},
        )
        assert status == 403
        # the same request from our own page goes through
        status, _, _ = await status_of(browser, "POST", url, json=body, headers={"Origin": w.url})
        assert status == 202
    await w.idle("abcdefgh")
    assert len(await w.tape("abcdefgh").query(kinds=["message"], names=["user"])) == 1
