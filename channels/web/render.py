"""Safe HTML for the web pages: Markdown through markdown-it-py with raw HTML off, escaping
helpers and the page shell. Nothing a model or a user wrote is ever emitted as markup."""

from __future__ import annotations

import functools
import json
from html import escape
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict

# `html: False` turns raw HTML (blocks and inline) into text; markdown-it's link validator
# already refuses javascript:, vbscript:, file: and non-image data: URLs.
_md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable(
    ["table", "strikethrough"]
)


def _link_open(
    self: RendererHTML, tokens: list[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    # Links open in a new tab without handing the page (or its URL) to the target.
    tokens[idx].attrSet("target", "_blank")
    tokens[idx].attrSet("rel", "noopener noreferrer nofollow")
    return self.renderToken(tokens, idx, options, env)


def _image(
    self: RendererHTML, tokens: list[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    # A model's image is shown as a link: the page never loads a URL a model chose (no
    # tracking pixels); the Content-Security-Policy would block a remote one anyway.
    token = tokens[idx]
    src = escape(str(token.attrGet("src") or ""))
    alt = escape(self.renderInlineAsText(token.children or [], options, env) or "image")
    return f'<a href="{src}" target="_blank" rel="noopener noreferrer nofollow">[image: {alt}]</a>'


_md.add_render_rule("link_open", _link_open)
_md.add_render_rule("image", _image)


def markdown(text: str) -> str:
    """Model text (Markdown) as safe HTML."""
    if len(text) > CACHED_TEXT:
        return _md.render(text)
    return _rendered(text)


CACHED_TEXT = 16_000
"""Texts up to this long are rendered once while they stay among the last `_rendered`."""


@functools.lru_cache(maxsize=256)
def _rendered(text: str) -> str:
    # A streamed answer's last partial and the answer itself are the same text, and every
    # page watching a conversation shows the same entries: each is rendered once (a render
    # costs about a millisecond: profiled, a sixth of the web chat's CPU).
    return _md.render(text)


def plain(text: str, cls: str = "plain") -> str:
    """Text shown as it is (line breaks kept by CSS)."""
    return f'<div class="{cls}">{escape(text)}</div>'


def when(date: str) -> str:
    """A tape date (ISO 8601) as shown on a page: to the second, a space for the `T`."""
    return escape(date[:19].replace("T", " "))


def pre(value: Any) -> str:
    """A value in a <pre> block: strings as they are, anything else as indented JSON."""
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False, indent=2, default=str)
    return f"<pre>{escape(value)}</pre>"


def json_arguments(arguments: Any) -> str:
    """Tool-call arguments (a JSON string from the model) pretty-printed when they parse."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return pre(arguments)
    return pre(arguments)


def attrs(**values: str) -> str:
    """HTML attributes, escaped."""
    return "".join(f' {k.replace("_", "-")}="{escape(v)}"' for k, v in values.items())


def page(title: str, body: str, *, nav: str = "", body_attrs: str = "", scripts: tuple = ()) -> str:
    """A complete HTML document: our stylesheet, no inline script (the CSP forbids it)."""
    tags = "".join(f'<script src="/static/{escape(s)}" defer></script>' for s in scripts)
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title>"
        '<link rel=stylesheet href="/static/style.css">'
        f"{tags}</head><body{body_attrs}>{nav}{body}</body></html>\n"
    )


def login_page(message: str, next_path: str) -> str:
    """The small form a request without a valid token gets (with status 401)."""
    body = (
        '<main class="login"><h1>bub-bot</h1>'
        f'<p class="note">{escape(message)}</p>'
        '<form method=post action="/login">'
        "<label>Access token <input type=password name=token autocomplete=current-password"
        " autofocus required></label>"
        f'<input type=hidden name=next value="{escape(next_path)}">'
        "<button type=submit>Log in</button></form>"
        '<p class="hint">The token is printed by <code>bub-bot serve</code> at start (the'
        " <code>?token=</code> link), or set with <code>BUB_WEB_TOKEN</code>.</p></main>"
    )
    return page("bub-bot: log in", body)
