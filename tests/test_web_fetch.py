"""web.fetch over real HTTP on loopback: HTML to text, the SSRF guard (allowance, redirects,
names that resolve to loopback, IP forms), content types, the caps, proxies and TLS."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
from pathlib import Path

import pytest
from aiohttp import web

from bub_bot.agent import ToolContext, ToolRegistry, default_registry
from bub_bot.agent.web_fetch import MAX_REDIRECTS, Fetcher, FetchError, register_web_fetch
from bub_bot.config import ConfigError
from bub_bot.netguard import Allowance, Refused, blocked
from tests.fakes.openai_server import text, tool_calls
from tests.fakes.web_site import FakeSite

PAGE = """<!doctype html><html><head><title>Release notes</title>
<style>body { color: red }</style><script>var tracking = "SCRIPT-BODY";</script></head>
<body><nav><a href="/">Home</a></nav>
<main><h1>Version 2.0</h1><p>The <b>new</b> parser, see <a href="/docs/parser">the docs</a>.</p>
<ul><li>faster</li><li>smaller</li></ul>
<table><tr><th>os</th><th>ok</th></tr><tr><td>linux</td><td>yes</td></tr></table></main>
</body></html>"""
FAILED = (Refused, FetchError)
ALLOWED_HOST = "127.0.0.2"  # the allowed fake; 127.0.0.1 is the loopback target to protect


def fixed_resolver(table: dict[str, list[str]], calls: list[str] | None = None):
    """A resolver answering from `table` (host -> addresses); records each lookup."""

    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        if host not in table:
            raise OSError(f"unknown host {host}")
        return table[host]

    return resolve


def fetcher(site: FakeSite | None = None, **kwargs) -> Fetcher:
    """A fetcher allowed to reach `site` (any port of its address) and nothing else."""
    allow = Allowance.parse([f"{site.host}:{site.port}"] if site else [])
    return Fetcher(allow=kwargs.pop("allow", allow), **kwargs)


async def call(registry: ToolRegistry, ctx: ToolContext, **args) -> tuple[bool, str]:
    return await registry.call(ctx, "web_fetch", json.dumps(args))


@pytest.fixture
async def site():
    async with FakeSite(ALLOWED_HOST) as made:
        yield made


@pytest.fixture
async def target():
    """A server on 127.0.0.1 that must never be reached."""
    async with FakeSite("127.0.0.1") as made:
        made.page("/", "INTERNAL-ONLY", "text/plain")
        made.page("/admin", "INTERNAL-ONLY", "text/plain")
        yield made


async def test_a_page_through_the_model_becomes_readable_text(fake_openai, agent, tape, site):
    site.page("/notes", PAGE, "text/html; charset=utf-8")
    site.redirect("/latest", "/notes", 301)
    url = site.url("/latest")
    fake_openai.script(tool_calls([("web_fetch", {"url": url})]), text("read it"))
    bot = agent(fetch_allow=f"{ALLOWED_HOST}:{site.port}")
    result = await bot.run_turn(tape, [{"role": "user", "content": "what is new?"}])
    assert result.status == "ok"

    sent = next(m for m in fake_openai.last_messages() if m["role"] == "tool")["content"]
    assert sent.startswith(f"URL: {site.url('/notes')}\nStatus: 200 OK\n")
    assert f"Redirected from: {url}\n" in sent
    assert "Content-Type: text/html\n" in sent
    assert "# Version 2.0" in sent
    assert "The **new** parser" in sent
    assert f"[the docs]({site.url('/docs/parser')})" in sent  # relative links made absolute
    assert "- faster\n- smaller" in sent
    assert "| linux | yes |" in sent
    assert "SCRIPT-BODY" not in sent and "color: red" not in sent
    assert site.paths() == ["/latest", "/notes"]
    # The tape has the model's argument and the final URL.
    entries = await tape.query(kinds=["tool_call", "tool_result"])
    call_args = json.loads(entries[0].payload["calls"][0]["function"]["arguments"])
    assert call_args == {"url": url}
    assert entries[1].payload["results"][0]["content"].startswith(f"URL: {site.url('/notes')}")


async def test_loopback_is_refused_without_the_allowance(tape, settings, workspace, target):
    ctx = ToolContext(tape=tape, workspace=workspace, settings=settings())
    registry = default_registry()
    for url in (target.url("/"), target.url("/", host="localhost")):
        ok, body = await call(registry, ctx, url=url)
        assert not ok
        assert "127.0.0.1, a loopback address" in body and "BUB_FETCH_ALLOW" in body
    assert "localhost resolves to 127.0.0.1" in body  # the system resolver, offline
    assert target.requests == []
    # The allowance is for one address and port: the same server is then reachable.
    ctx = ToolContext(
        tape=tape, workspace=workspace, settings=settings(fetch_allow=f"127.0.0.1:{target.port}")
    )
    ok, body = await call(registry, ctx, url=target.url("/"))
    assert ok and body.endswith("\n\nINTERNAL-ONLY")


async def test_redirects_to_loopback_and_metadata_are_refused_unrequested(site, target):
    site.redirect("/to-loopback", target.url("/admin"))
    site.redirect("/to-localhost", target.url("/admin", host="localhost"), 307)
    site.redirect("/to-metadata", "http://169.254.169.254/latest/meta-data/iam/")
    site.redirect("/to-metadata-v6", "http://[fd00:ec2::254]/latest/meta-data/", 308)
    site.redirect("/to-mapped", f"http://[::ffff:127.0.0.1]:{target.port}/admin")
    site.redirect("/to-file", "file:///etc/passwd")
    site.redirect("/to-userinfo", f"http://admin:pw@{ALLOWED_HOST}:{site.port}/")
    fetch = fetcher(site)
    reasons = {}
    for path in site.routes:
        with pytest.raises(FAILED) as caught:
            await fetch.fetch(site.url(path))
        reasons[path] = str(caught.value)
    assert "127.0.0.1, a loopback address" in reasons["/to-loopback"]
    assert "localhost resolves to 127.0.0.1, a loopback" in reasons["/to-localhost"]
    assert "169.254.169.254, a cloud metadata address" in reasons["/to-metadata"]
    assert "fd00:ec2::254, a cloud metadata address" in reasons["/to-metadata-v6"]
    assert "loopback (IPv4-mapped IPv6) address" in reasons["/to-mapped"]
    assert "only http and https" in reasons["/to-file"] and "redirect to" in reasons["/to-file"]
    assert "user-info" in reasons["/to-userinfo"]
    assert target.requests == []  # the redirect targets were never requested
    assert sorted(site.paths()) == sorted(site.routes)  # each redirect asked once


async def test_names_resolving_to_loopback_are_refused_and_the_answer_is_pinned(site, target):
    calls: list[str] = []
    table = {
        "intranet.test": ["127.0.0.1"],
        "mixed.test": ["93.184.216.34", "127.0.0.1"],  # one bad address refuses the name
        "site.test": [ALLOWED_HOST],
    }
    fetch = fetcher(site, resolver=fixed_resolver(table, calls))
    for name, detail in [
        ("intranet.test", "intranet.test resolves to 127.0.0.1, a loopback address"),
        ("mixed.test", "mixed.test resolves to 127.0.0.1, a loopback address"),
    ]:
        with pytest.raises(FAILED, match=detail):
            await fetch.fetch(f"http://{name}:{target.port}/admin")
    assert target.requests == []

    # Resolved once, then connected to that address: a second answer (DNS rebinding to
    # 127.0.0.1) is never asked for; the Host header still names the site.
    site.page("/", "pinned", "text/plain")
    calls.clear()
    page = await fetch.fetch(f"http://site.test:{site.port}/")
    table["site.test"] = ["127.0.0.1"]
    assert page.text == "pinned" and calls == ["site.test"]
    assert site.requests[-1].headers["Host"] == f"site.test:{site.port}"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://[::ffff:127.0.0.1]/", "loopback (IPv4-mapped IPv6)"),
        ("http://[::ffff:7f00:1]/", "loopback (IPv4-mapped IPv6)"),
        ("http://[::127.0.0.1]/", "loopback (IPv4-compatible IPv6)"),
        ("http://[::1]/", "a loopback address"),
        ("http://[2002:7f00:1::]/", "loopback (6to4 IPv6)"),
        ("http://[64:ff9b::a00:1]/", "private (NAT64 IPv6)"),
        ("http://2130706433/", "IP address 127.0.0.1 written in a non-standard form"),
        ("http://0177.0.0.1/", "IP address 127.0.0.1 written in a non-standard form"),
        ("http://0x7f.0.0.1/", "IP address 127.0.0.1 written in a non-standard form"),
        ("http://127.1/", "IP address 127.0.0.1 written in a non-standard form"),
        ("http://0.0.0.0/", "an unspecified address"),
        ("http://10.1.2.3/", "a private address"),
        ("http://192.168.1.1/", "a private address"),
        ("http://100.64.0.1/", "a CGNAT (shared) address"),
        ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
        ("http://169.254.10.10/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://[fc00::1]/", "a private address"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[ff02::1]/", "multicast"),
        ("http://240.0.0.1/", "reserved"),
        ("http://user:secret@example.com/", "user-info"),
        ("http://user@example.com/", "user-info"),
        ("ftp://example.com/file", "only http and https URLs can be fetched"),
        ("file:///etc/passwd", "only http and https URLs can be fetched"),
        ("javascript:alert(1)", "only http and https URLs can be fetched"),
        ("example.com/page", "only http and https URLs can be fetched"),
        ("http://[fe80::1%25eth0]/", "zone"),
    ],
)
async def test_urls_refused_before_any_connection(url, reason):
    calls: list[str] = []
    fetch = Fetcher(resolver=fixed_resolver({}, calls))
    with pytest.raises(Refused) as caught:
        await fetch.fetch(url)
    assert reason in str(caught.value)
    assert calls == []  # refused without even a DNS lookup


async def test_ports_other_than_80_and_443_need_the_allowance(site):
    public = fixed_resolver({"example.com": ["93.184.216.34"]})
    with pytest.raises(FAILED, match=r"refused: port 22 of example\.com; web\.fetch uses ports"):
        await Fetcher(resolver=public).fetch("http://example.com:22/")
    site.page("/", "on a port", "text/plain")
    # An entry without a port allows the address on 80 and 443 only.
    with pytest.raises(FAILED, match=f"refused: port {site.port} of {ALLOWED_HOST}"):
        await Fetcher(allow=Allowance.parse([ALLOWED_HOST])).fetch(site.url("/"))
    page = await Fetcher(allow=Allowance.parse([f"{ALLOWED_HOST}:*"])).fetch(site.url("/"))
    assert page.text == "on a port"


def test_address_ranges():
    public = ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "2002:808:808::"]
    assert [blocked(ipaddress.ip_address(a)) for a in public] == [None] * len(public)
    assert blocked(ipaddress.ip_address("198.18.0.5")) == "reserved"  # fake-IP proxies
    assert blocked(ipaddress.ip_address("168.63.129.16")) == "cloud metadata"
    allow = Allowance.parse(["10.0.0.0/8", "wiki.internal", "*.corp.test:8443", "[fd00::/8]:*"])
    ten = ipaddress.ip_address("10.2.3.4")
    assert allow.covers("x", ten, 80) and not allow.covers("x", ten, 8080)
    other = ipaddress.ip_address("172.16.0.5")
    assert allow.covers("wiki.internal", other, 443) and not allow.covers("wiki.x", other, 443)
    assert allow.covers("a.corp.test", other, 8443) and not allow.covers("corp.test", other, 8443)
    assert not allow.covers("a.corp.test", other, 443)
    assert allow.covers("x", ipaddress.ip_address("fd00::5"), 9999)
    # A host name's DNS answer never unlocks a metadata address; an IP entry does.
    meta = ipaddress.ip_address("169.254.169.254")
    assert not Allowance.parse(["wiki.internal"]).covers("wiki.internal", meta, 80, metadata=True)
    assert Allowance.parse(["169.254.169.254"]).covers("x", meta, 80, metadata=True)


async def test_the_allowance_setting_is_checked(settings):
    with pytest.raises(ConfigError, match=r"BUB_FETCH_ALLOW: 'not a host' is not a host"):
        settings(fetch_allow="10.0.0.0/8, not a host")
    with pytest.raises(ConfigError, match=r"BUB_FETCH_ALLOW: '127\.0\.0\.1:99999'"):
        settings(fetch_allow="127.0.0.1:99999")
    assert settings(fetch_allow="127.0.0.1:8123, 10.0.0.0/8,wiki.internal").fetch_allow == [
        "127.0.0.1:8123",
        "10.0.0.0/8",
        "wiki.internal",
    ]


async def test_content_types_caps_and_redirect_limit(site):
    site.page("/logo.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 50_000, "image/png")
    site.page("/untyped", b"GIF89a\0\0\0binary", "")
    site.page("/fake.txt", b"MZ\x90\0\x03\0\0\0", "text/plain")
    site.page("/utf16.txt", "hé".encode("utf-16"), "text/plain; charset=utf-16")
    site.page("/data.json", '{"ok": true}', "application/json")
    site.page("/latin1", "caf\xe9".encode("latin-1"), "text/plain; charset=iso-8859-1")
    site.page("/big.txt", "0123456789" * 10_000, "text/plain")
    for i in range(MAX_REDIRECTS + 2):
        site.redirect(f"/hop/{i}", f"/hop/{i + 1}")
    fetch = fetcher(site, max_bytes=2048)

    with pytest.raises(FAILED, match=r"is image/png, \d+ bytes: web.fetch reads HTML and text"):
        await fetch.fetch(site.url("/logo.png"))
    with pytest.raises(FAILED, match="no content type and looks binary"):
        await fetch.fetch(site.url("/untyped"))
    with pytest.raises(FAILED, match=r"says text/plain but looks binary \(NUL bytes\)"):
        await fetch.fetch(site.url("/fake.txt"))
    assert (await fetch.fetch(site.url("/utf16.txt"))).text == "hé"
    assert (await fetch.fetch(site.url("/data.json"))).text == '{"ok": true}'
    assert (await fetch.fetch(site.url("/latin1"))).text == "café"

    big = await fetch.fetch(site.url("/big.txt"))
    assert big.cut and big.bytes_read == 2048 and big.text == ("0123456789" * 205)[:2048]

    with pytest.raises(FAILED, match=f"too many redirects \\(more than {MAX_REDIRECTS}\\)"):
        await fetch.fetch(site.url("/hop/0"))
    assert site.paths()[-(MAX_REDIRECTS + 1) :] == [f"/hop/{i}" for i in range(MAX_REDIRECTS + 1)]


async def test_notes_for_cut_pages_and_large_pages_spill(fake_openai, agent, tape, site):
    site.page("/big.txt", "line of text\n" * 10_000, "text/plain")
    fake_openai.script(
        tool_calls(
            [
                ("web_fetch", {"url": site.url("/big.txt"), "max_chars": 100}),
                ("web_fetch", {"url": site.url("/big.txt")}),
            ]
        ),
        text("done"),
    )
    bot = agent(fetch_allow=f"{ALLOWED_HOST}:{site.port}", fetch_max_bytes=65536)
    await bot.run_turn(tape, [{"role": "user", "content": "read"}])
    cut, spilled = [m["content"] for m in fake_openai.last_messages() if m["role"] == "tool"]
    assert "Note: the text is cut at 100 of 65536 characters; call web_fetch again" in cut
    assert "only its first 65536 bytes were read" in cut
    assert "spill.read(handle=" in spilled and len(spilled) < 2000


async def test_timeout(site):
    async def slow(_request):
        await asyncio.sleep(30)  # cancelled when the site stops
        return web.Response(text="late")

    site.route("/slow", slow)
    with pytest.raises(FAILED, match=r"timed out after 0.3 s \(BUB_FETCH_TIMEOUT_SECONDS\)"):
        await fetcher(site, timeout=0.3).fetch(site.url("/slow"))


async def test_secrets_in_a_page_are_scrubbed(fake_openai, agent, tape, site):
    secret = "sk-live-in-the-page-4242"
    site.page("/leak", f"<p>key: {secret}</p>", "text/html")
    fake_openai.script(tool_calls([("web_fetch", {"url": site.url("/leak")})]), text("ok"))
    bot = agent(fetch_allow=f"{ALLOWED_HOST}:{site.port}", openai_api_key=secret)
    await bot.run_turn(tape, [{"role": "user", "content": "read"}])
    sent = next(m for m in fake_openai.last_messages() if m["role"] == "tool")["content"]
    assert "key: [redacted]" in sent
    assert secret not in json.dumps([r.body for r in fake_openai.completion_requests()])
    assert secret not in json.dumps([e.payload for e in await tape.query()])


async def test_environment_proxies_are_not_used(monkeypatch, site):
    async with FakeSite("127.0.0.1") as proxy:
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy.url("/"))
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        site.page("/", "direct", "text/plain")
        page = await fetcher(site).fetch(site.url("/"))
        assert page.text == "direct" and proxy.requests == []


def certificate(tmp_path: Path, name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context for `name`, client context trusting only its test CA)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject, issuer, key, signer, ca: bool, san: list[str] | None = None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(n) for n in san]), critical=False
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = build("bub test CA", "bub test CA", ca_key, ca_key, True)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = build(name, "bub test CA", key, ca_key, False, [name])
    pem = serialization.Encoding.PEM
    (tmp_path / "leaf.pem").write_bytes(leaf.public_bytes(pem))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp_path / "leaf.pem", tmp_path / "key.pem")
    client = ssl.create_default_context(cadata=ca.public_bytes(pem).decode())
    return server, client


async def test_tls_is_verified_against_the_host_name_while_pinned(tmp_path):
    server_ctx, client_ctx = certificate(tmp_path, "site.test")
    async with FakeSite(ALLOWED_HOST, ssl_context=server_ctx) as secure:
        secure.page("/", "over TLS", "text/plain")
        resolver = fixed_resolver({"site.test": [ALLOWED_HOST], "other.test": [ALLOWED_HOST]})
        fetch = fetcher(secure, resolver=resolver, ssl_context=client_ctx)
        page = await fetch.fetch(f"https://site.test:{secure.port}/")
        assert page.text == "over TLS" and page.url == f"https://site.test:{secure.port}/"
        # The same pinned address under another name: the certificate does not match it.
        with pytest.raises(FAILED, match=r"TLS certificate of other\.test is not valid"):
            await fetch.fetch(f"https://other.test:{secure.port}/")
        # And by address (no name to check the certificate against): refused too.
        with pytest.raises(FAILED, match="TLS certificate"):
            await fetch.fetch(secure.url("/"))
        assert secure.paths() == ["/"]


async def test_an_injected_fetcher_through_the_registry(tape, settings, workspace, site):
    site.page("/", "<p>hello</p>", "text/html")
    registry = ToolRegistry()
    register_web_fetch(registry, fetcher(site, resolver=fixed_resolver({"s.test": [site.host]})))
    ctx = ToolContext(tape=tape, workspace=workspace, settings=settings())
    ok, body = await call(registry, ctx, url=f"http://s.test:{site.port}/")
    assert ok and body.endswith("\n\nhello")
    ok, body = await call(registry, ctx, url="http://s.test/", max_chars=0)
    assert not ok and body.startswith("error: invalid arguments for web_fetch: max_chars")
    ok, body = await call(registry, ctx, url="gopher://s.test/")
    assert not ok and body.startswith("error: only http and https URLs can be fetched")
