"""`web.fetch`: GET a page over http(s) and give the model its text.

Every hop (the URL, then each redirect, at most MAX_REDIRECTS) is checked by `netguard`:
the host is resolved once, its addresses checked, and the connection made to that address
only (aiohttp asks our pinned resolver, which answers without DNS; TLS is still verified
against the host name, sent as SNI). Redirects are followed here, never by the client.
Proxies from the environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY) are not used: a proxy
resolves names itself, past these checks. HTML becomes Markdown (html-to-markdown), other
text types come as they are, binary types are refused without reading them.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import re
import socket
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import aiohttp
import html_to_markdown
from aiohttp.abc import AbstractResolver, ResolveResult
from pydantic import Field
from yarl import URL

from ..netguard import Allowance, Refused, Resolver, check_url, pin, system_resolver
from .tools import ToolContext, ToolError, ToolRegistry

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5
MAX_CHARS_DEFAULT = 50_000
MAX_CHARS_LIMIT = 1_000_000
SNIFF_BYTES = 4096
USER_AGENT = "bub-bot (web.fetch)"
REDIRECTS = frozenset({301, 302, 303, 307, 308})
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/ld+json",
        "application/x-ndjson",
        "application/xml",
        "application/javascript",
        "application/ecmascript",
        "application/x-javascript",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/sql",
        "application/graphql",
        "application/x-sh",
        "application/x-httpd-php",
        "application/csv",
    }
)
_META_CHARSET = re.compile(
    rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.I
)


@dataclass(slots=True)
class Page:
    """What one fetch got: the final URL, the redirects on the way, and the text."""

    url: str
    status: int
    reason: str
    content_type: str
    text: str
    redirects: list[str] = field(default_factory=list)
    bytes_read: int = 0
    cut: bool = False
    """The body went on past BUB_FETCH_MAX_BYTES (only the first bytes were read)."""


class FetchError(Exception):
    """A fetch that failed (timeout, connection, TLS, a binary type); the message says why."""


class _PinnedResolver(AbstractResolver):
    """Answers aiohttp with the one address `netguard.pin` checked: no second lookup."""

    def __init__(self, host: str, address: str) -> None:
        self.host, self.address = host, address

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host.rstrip(".").lower() != self.host:
            raise OSError(f"web.fetch resolves only {self.host}, not {host}")
        inet = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        return [
            {
                "hostname": host,
                "host": self.address,
                "port": port,
                "family": inet,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            }
        ]

    async def close(self) -> None:
        return None


def _media_type(header: str) -> tuple[str, str | None]:
    """(`type/subtype`, charset or None) of a Content-Type header."""
    kind, _, params = header.partition(";")
    charset = None
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            charset = value.strip().strip("\"'") or None
    return kind.strip().lower(), charset


def _is_text(kind: str) -> bool:
    return (
        kind.startswith("text/")
        or kind in TEXT_TYPES
        or (kind.startswith("application/") and kind.endswith(("+json", "+xml")))
    )


def _codec(charset: str | None, head: bytes, html: bool) -> str:
    """The codec to decode the body with: the header's charset, else a `<meta charset>` in
    the first bytes of an HTML page, else UTF-8."""
    for name in (charset, _meta_charset(head) if html else None):
        if name:
            try:
                return codecs.lookup(name).name
            except LookupError:
                continue
    return "utf-8"


def _meta_charset(head: bytes) -> str | None:
    found = _META_CHARSET.search(head[:SNIFF_BYTES])
    return found.group(1).decode("ascii") if found else None


def html_to_text(html: str, base_url: str) -> str:
    """An HTML page as Markdown: headings, lists, tables, links made absolute; scripts,
    styles, navigation and forms left out; inline data: images as their alt text. The one
    place that knows the library (runs in a thread: it releases the GIL)."""
    options = html_to_markdown.ConversionOptions(
        base_url=base_url,
        inline_data_media="alt_text_only",
        preprocessing=html_to_markdown.PreprocessingOptions(enabled=True, preset="standard"),
    )
    return html_to_markdown.convert(html, options).content.strip()


class Fetcher:
    """GETs pages for web.fetch under the operator's limits and the SSRF rules.

    `resolver` (host, port -> addresses) and `ssl_context` are injectable: tests resolve
    names to loopback fakes and trust their own certificate through them."""

    def __init__(
        self,
        *,
        timeout: float = 20.0,
        max_bytes: int = 5 * 1024 * 1024,
        allow: Allowance | None = None,
        resolver: Resolver = system_resolver,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.allow = allow or Allowance()
        self.resolver = resolver
        self.ssl_context = ssl_context

    @classmethod
    def for_settings(cls, settings: Settings, **kwargs: Any) -> Fetcher:
        """A fetcher with BUB_FETCH_TIMEOUT_SECONDS, BUB_FETCH_MAX_BYTES, BUB_FETCH_ALLOW."""
        return cls(
            timeout=settings.fetch_timeout_seconds,
            max_bytes=settings.fetch_max_bytes,
            allow=Allowance.parse(settings.fetch_allow),
            **kwargs,
        )

    async def fetch(self, url: str) -> Page:
        """GET `url`, following up to MAX_REDIRECTS redirects, each checked before it is
        requested. Raises Refused (not allowed) or FetchError (it went wrong)."""
        current = check_url(url)
        redirects: list[str] = []
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    page, location = await self._hop(current)
                    if location is None:
                        page.redirects = redirects
                        return page
                    if len(redirects) >= MAX_REDIRECTS:
                        raise FetchError(
                            f"too many redirects (more than {MAX_REDIRECTS}): "
                            + " -> ".join([*redirects, str(current)])
                        )
                    redirects.append(str(current))
                    try:
                        joined = current.join(URL(location))
                    except (ValueError, TypeError):
                        raise Refused(
                            f"{current} redirects to {location!r}, which is not a valid URL"
                        ) from None
                    current = check_url(joined, redirect=True)
        except TimeoutError:
            raise FetchError(
                f"timed out after {self.timeout:g} s (BUB_FETCH_TIMEOUT_SECONDS) fetching {current}"
            ) from None

    async def _hop(self, url: URL) -> tuple[Page, str | None]:
        """One request to the pinned address of `url`: (page, None) or (_, Location)."""
        address = await pin(url, self.allow, self.resolver)
        host = (url.raw_host or "").rstrip(".").lower()
        connector = aiohttp.TCPConnector(
            resolver=_PinnedResolver(host, address),
            use_dns_cache=False,
            force_close=True,
            limit=1,
            ssl=self.ssl_context if self.ssl_context is not None else True,
        )
        headers = {"User-Agent": USER_AGENT, "Accept": "text/html,text/*;q=0.9,*/*;q=0.5"}
        try:
            async with (
                aiohttp.ClientSession(
                    connector=connector,
                    cookie_jar=aiohttp.DummyCookieJar(),
                    trust_env=False,  # no env proxy, no .netrc: see the module docstring
                ) as session,
                session.get(url, allow_redirects=False, headers=headers) as resp,
            ):
                if resp.status in REDIRECTS and "Location" in resp.headers:
                    empty = Page(str(url), resp.status, resp.reason or "", "", "")
                    return empty, resp.headers["Location"]
                return await self._read(url, resp), None
        except aiohttp.ClientConnectorCertificateError as exc:
            raise FetchError(f"the TLS certificate of {host} is not valid: {exc}") from None
        except aiohttp.ClientSSLError as exc:
            raise FetchError(f"TLS with {host} failed: {exc}") from None
        except aiohttp.ClientConnectorError as exc:
            raise FetchError(f"cannot connect to {host} ({address}): {exc.os_error}") from None
        except aiohttp.ClientError as exc:
            raise FetchError(f"fetching {url} failed: {type(exc).__name__}: {exc}") from None

    async def _read(self, url: URL, resp: aiohttp.ClientResponse) -> Page:
        kind, charset = _media_type(resp.headers.get("Content-Type", ""))
        if kind and not _is_text(kind) and kind not in HTML_TYPES:
            size = resp.headers.get("Content-Length")
            detail = f", {size} bytes" if size and size.isdigit() else ""
            raise FetchError(
                f"{url} is {kind}{detail}: web.fetch reads HTML and text only, not binary files"
            )
        body, cut = await self._body(resp)
        head = body[:SNIFF_BYTES]
        if not kind:  # no type given: text only if it looks like text
            if b"\0" in head:
                raise FetchError(f"{url} has no content type and looks binary: not used")
            kind = "text/html" if head.lstrip()[:1] == b"<" else "text/plain"
        html = kind in HTML_TYPES
        codec = _codec(charset, body, html)
        if b"\0" in head and not codec.startswith(("utf-16", "utf-32")):
            raise FetchError(f"{url} says {kind} but looks binary (NUL bytes): not used")
        # No NUL characters past this point: PostgreSQL's JSON cannot store them on the tape.
        text = body.decode(codec, errors="replace").replace("\0", "\ufffd")
        if html:
            text = await asyncio.to_thread(html_to_text, text, str(url))
        return Page(str(url), resp.status, resp.reason or "", kind, text, [], len(body), cut)

    async def _body(self, resp: aiohttp.ClientResponse) -> tuple[bytes, bool]:
        """At most `max_bytes` of the (decompressed) body, and whether more followed."""
        chunks: list[bytes] = []
        total = 0
        async for chunk in resp.content.iter_chunked(64 * 1024):
            room = self.max_bytes - total
            if len(chunk) > room:
                chunks.append(chunk[:room])
                return b"".join(chunks), True
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks), False


def render(page: Page, max_chars: int) -> str:
    """The tool result: a short header (final URL, status, type, redirects, cuts), then the
    text, cut at `max_chars` with a note saying how to get more."""
    lines = [f"URL: {page.url}", f"Status: {page.status} {page.reason}".rstrip()]
    if page.redirects:
        lines.append("Redirected from: " + " -> ".join(page.redirects))
    lines.append(f"Content-Type: {page.content_type}")
    if page.cut:
        lines.append(
            f"Note: the page is larger than BUB_FETCH_MAX_BYTES; only its first"
            f" {page.bytes_read} bytes were read"
        )
    text = page.text
    if len(text) > max_chars:
        lines.append(
            f"Note: the text is cut at {max_chars} of {len(text)} characters"
            + (
                f"; call web_fetch again with a larger max_chars (up to {MAX_CHARS_LIMIT})"
                if max_chars < MAX_CHARS_LIMIT
                else ""
            )
        )
        text = text[:max_chars]
    return "\n".join(lines) + "\n\n" + text


def register_web_fetch(registry: ToolRegistry, fetcher: Fetcher | None = None) -> None:
    """Add `web.fetch` to `registry`. Without `fetcher`, each call uses one built from the
    call's settings (cheap: the fetcher holds no connections)."""
    cached: list[tuple[Any, Fetcher]] = []

    def fetcher_for(settings: Settings) -> Fetcher:
        if fetcher is not None:
            return fetcher
        key = (
            settings.fetch_timeout_seconds,
            settings.fetch_max_bytes,
            tuple(settings.fetch_allow),
        )
        if not cached or cached[0][0] != key:
            cached[:] = [(key, Fetcher.for_settings(settings))]
        return cached[0][1]

    @registry.tool("web.fetch")
    async def web_fetch(
        ctx: ToolContext,
        url: Annotated[str, Field(min_length=1, max_length=8192, description="http(s) URL")],
        max_chars: Annotated[
            int,
            Field(ge=1, le=MAX_CHARS_LIMIT, description="most characters of text to return"),
        ] = MAX_CHARS_DEFAULT,
    ) -> str:
        """Fetch a web page (GET) and read it as text: HTML comes as Markdown, other text as it is. Public addresses only; binary files are refused."""
        session = ctx.tape.session_id
        try:
            page = await fetcher_for(ctx.settings).fetch(url)
        except (Refused, FetchError) as exc:
            log.info("web.fetch.refused session=%s: %s", session, exc)
            raise ToolError(str(exc)) from None
        log.info(
            "web.fetch session=%s host=%s status=%d type=%s bytes=%d redirects=%d",
            session,
            URL(page.url).host,
            page.status,
            page.content_type,
            page.bytes_read,
            len(page.redirects),
        )
        return render(page, max_chars)


__all__ = ["MAX_REDIRECTS", "FetchError", "Fetcher", "Page", "html_to_text", "register_web_fetch"]
