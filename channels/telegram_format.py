"""Model Markdown -> Telegram's HTML subset, cut into messages Telegram accepts.

Telegram's `parse_mode=HTML` understands a handful of tags (`b i u s code pre a blockquote
...`); anything else is rejected with "can't parse entities". A message may hold at most 4096
characters *after entity parsing*, counted in UTF-16 code units (an emoji outside the BMP is
two). This module has no aiogram dependency so it is quick to import and test.

`split_markdown` cuts the Markdown *source* (so every piece also remembers its plain text for
the parse-error fallback) at paragraph boundaries where possible, then line boundaries, then
spaces; a fenced code block cut in two is closed at the end of one piece and reopened (same
language) at the start of the next. The rendered text of a piece is never longer than its
source, so a source piece within the limit is a valid message in both modes.
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass

LIMIT = 4096
"""Telegram's maximum message length after entity parsing, in UTF-16 code units."""

_FENCE_RE = re.compile(r"^ {0,3}(?P<fence>`{3,8}|~{3,8})[ \t]*(?P<lang>[\w+#.-]{0,32})[ \t]*$")
_HEADING_RE = re.compile(r"^ {0,3}#{1,6}[ \t]+(?P<text>.*?)[ \t]*#*[ \t]*$")
_QUOTE_RE = re.compile(r"^ {0,3}> ?(?P<text>.*)$")
_BULLET_RE = re.compile(r"^(?P<indent>[ \t]*)[-*+][ \t]+(?=\S)")
_RULE_RE = re.compile(r"^ {0,3}([-*_])([ \t]*\1){2,}[ \t]*$")
_URL_OK = re.compile(r"^(https?|tg|mailto):", re.IGNORECASE)
# Inline spans, tried in this order at each position (the earliest match wins).
_INLINE_RE = re.compile(
    r"(?P<code>(?P<ticks>`+)(?P<code_text>.+?)(?P=ticks))"
    r"|(?P<link>\[(?P<link_text>[^\]\n]+)\]\((?P<url>[^()\s]+(?:\([^()\s]*\)[^()\s]*)*)\))"
    r"|(?P<bold>\*\*(?=\S)(?P<bold_text>.+?)(?<=\S)\*\*)"
    r"|(?P<ubold>(?<![\w])__(?=\S)(?P<ubold_text>.+?)(?<=\S)__(?![\w]))"
    r"|(?P<strike>~~(?=\S)(?P<strike_text>.+?)(?<=\S)~~)"
    r"|(?P<ital>(?<![*\w])\*(?=[^\s*])(?P<ital_text>[^*]+?)(?<=[^\s*])\*(?![*\w]))"
    r"|(?P<uital>(?<![\w])_(?=[^\s_])(?P<uital_text>[^_]+?)(?<=[^\s_])_(?![\w]))"
    r"|(?P<spoiler>\|\|(?=\S)(?P<spoiler_text>.+?)(?<=\S)\|\|)"
)
_TAG_RE = re.compile(r"<[^>]*>")
_FENCE_OVERHEAD = 8 + 32 + 1 + 1 + 8  # fence + language + "\n" before, "\n" + fence after
# Characters that belong to the previous one (never cut before them): joiners, variation
# selectors, skin tones, combining marks, the low half of a flag or keycap sequence.
_JOINERS = frozenset("\u200d\ufe0e\ufe0f\u20e3")


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units: how Telegram counts message length and entity offsets."""
    return len(text.encode("utf-16-le")) // 2


def escape(text: str) -> str:
    """Escape text for Telegram HTML (only `& < >` are special; quotes matter in attributes)."""
    return html.escape(text, quote=False)


# -- Markdown -> HTML --------------------------------------------------------------------------
def inline_html(text: str) -> str:
    """One line of Markdown inline syntax as Telegram HTML. Never produces unbalanced tags."""
    out: list[str] = []
    pos = 0
    for m in _INLINE_RE.finditer(text):
        out.append(escape(text[pos : m.start()]))
        pos = m.end()
        kind = m.lastgroup
        if m.group("code") is not None:
            inner = m.group("code_text")
            if inner.strip() and len(m.group("ticks")) > 1 and inner.startswith(" "):
                inner = inner[1:-1] if inner.endswith(" ") else inner
            out.append(f"<code>{escape(inner)}</code>")
        elif m.group("link") is not None:
            label, url = m.group("link_text"), m.group("url")
            if _URL_OK.match(url):
                href = html.escape(url, quote=True)
                out.append(f'<a href="{href}">{inline_html(label)}</a>')
            else:
                out.append(f"{inline_html(label)} ({escape(url)})")
        elif m.group("bold") is not None or m.group("ubold") is not None:
            inner = m.group("bold_text") or m.group("ubold_text")
            out.append(f"<b>{inline_html(inner)}</b>")
        elif m.group("strike") is not None:
            out.append(f"<s>{inline_html(m.group('strike_text'))}</s>")
        elif m.group("ital") is not None or m.group("uital") is not None:
            inner = m.group("ital_text") or m.group("uital_text")
            out.append(f"<i>{inline_html(inner)}</i>")
        elif kind == "spoiler":
            out.append(f"<tg-spoiler>{inline_html(m.group('spoiler_text'))}</tg-spoiler>")
        else:  # pragma: no cover - every alternative is handled above
            out.append(escape(m.group(0)))
    out.append(escape(text[pos:]))
    return "".join(out)


def _block_line(line: str) -> str:
    """A non-code line: headings bold, bullets as •, everything else inline-formatted."""
    if m := _HEADING_RE.match(line):
        return f"<b>{inline_html(m.group('text'))}</b>" if m.group("text") else ""
    if _RULE_RE.match(line):
        return escape(line)
    if m := _BULLET_RE.match(line):
        line = f"{m.group('indent')}• {line[m.end() :]}"
    return inline_html(line)


def markdown_to_html(text: str) -> str:
    """Markdown (as models write it) as Telegram HTML. An unclosed code fence ends the text."""
    out: list[str] = []
    quote: list[str] = []
    code: list[str] | None = None
    fence = lang = ""

    def flush_quote() -> None:
        if quote:
            out.append("<blockquote>" + "\n".join(quote) + "</blockquote>")
            quote.clear()

    def flush_code() -> None:
        body = escape("\n".join(code or []))
        if lang:
            out.append(f'<pre><code class="language-{lang}">{body}</code></pre>')
        else:
            out.append(f"<pre>{body}</pre>")

    for line in text.split("\n"):
        if code is not None:
            m = _FENCE_RE.match(line)
            if m and not m.group("lang") and m.group("fence")[0] == fence[0]:
                if len(m.group("fence")) >= len(fence):
                    flush_code()
                    code = None
                    continue
            code.append(line)
            continue
        m = _FENCE_RE.match(line)
        if m:
            flush_quote()
            code, fence, lang = [], m.group("fence"), m.group("lang")
            continue
        if qm := _QUOTE_RE.match(line):
            quote.append(_block_line(qm.group("text")))
            continue
        flush_quote()
        out.append(_block_line(line))
    flush_quote()
    if code is not None:
        flush_code()
    return "\n".join(out)


def html_to_text(text: str) -> str:
    """The text Telegram shows for our HTML (tags dropped, entities decoded)."""
    return html.unescape(_TAG_RE.sub("", text))


def rendered_len(html_text: str) -> int:
    """UTF-16 length of the message Telegram would build from `html_text` (trimmed)."""
    return utf16_len(html_to_text(html_text).strip())


# -- splitting ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Piece:
    """One message: its HTML and the Markdown it came from (sent as is if HTML is refused)."""

    html: str
    markdown: str


@dataclass(slots=True)
class _Seg:
    """A line of the source (or part of an over-long line, `sep == ""`)."""

    text: str
    sep: str  # what joins it to the previous segment: "\n", or "" for a cut long line
    code_before: str | None  # language ("" for none) if inside a code block before this seg
    opens: str | None = None  # fence opening line: the language
    fence: str = ""  # the fence string that opened the block this segment is in / opens
    closes: bool = False  # a closing fence line
    blank: bool = False


def _cut_point(text: str, budget: int) -> int:
    """Index to cut `text` at so that `text[:i]` is at most `budget` UTF-16 units, preferring
    the last space; never inside a surrogate pair or a joined emoji / combining sequence."""
    units = 0
    hard = 0
    for i, ch in enumerate(text):
        units += 2 if ord(ch) > 0xFFFF else 1
        if units > budget:
            break
        hard = i + 1
    if hard >= len(text):
        return len(text)
    space = text.rfind(" ", 0, hard)
    if space >= hard // 2 and space > 0:
        return space + 1
    i = hard
    while i > 1 and _clings(text, i):
        i -= 1
    return i if i > 0 else hard


def _clings(text: str, i: int) -> bool:
    """Whether text[i] must stay with text[i - 1]."""
    ch, prev = text[i], text[i - 1]
    if ch in _JOINERS or prev == "\u200d" or unicodedata.combining(ch):
        return True
    if 0x1F3FB <= ord(ch) <= 0x1F3FF or 0xE0020 <= ord(ch) <= 0xE007F:
        return True
    # Regional indicators pair up into flags: keep an odd-position pair together.
    if 0x1F1E6 <= ord(ch) <= 0x1F1FF and 0x1F1E6 <= ord(prev) <= 0x1F1FF:
        run = 0
        j = i - 1
        while j >= 0 and 0x1F1E6 <= ord(text[j]) <= 0x1F1FF:
            run += 1
            j -= 1
        return run % 2 == 1
    return False


def _segments(text: str, budget: int) -> list[_Seg]:
    segs: list[_Seg] = []
    code: str | None = None
    fence = ""
    for line in text.split("\n"):
        m = _FENCE_RE.match(line)
        if code is None and m:
            segs.append(_Seg(line, "\n", None, opens=m.group("lang"), fence=m.group("fence")))
            code, fence = m.group("lang"), m.group("fence")
            continue
        if (
            code is not None
            and m
            and not m.group("lang")
            and m.group("fence")[0] == fence[0]
            and len(m.group("fence")) >= len(fence)
        ):
            segs.append(_Seg(line, "\n", code, fence=fence, closes=True))
            code = None
            continue
        sep = "\n"
        rest = line
        while utf16_len(rest) > budget:
            cut = _cut_point(rest, budget)
            segs.append(_Seg(rest[:cut], sep, code, fence=fence))
            rest, sep = rest[cut:], ""
        segs.append(_Seg(rest, sep, code, fence=fence, blank=not rest.strip()))
    return segs


def _render(segs: list[_Seg]) -> str:
    """The Markdown of a piece: reopen a code block it starts inside, close one it ends in."""
    first = segs[0]
    parts: list[str] = []
    if first.code_before is not None and first.opens is None:
        parts.append(first.fence + first.code_before + "\n")
    parts.append(first.text)
    for seg in segs[1:]:
        parts.append(seg.sep + seg.text)
    last = segs[-1]
    inside = last.opens is not None or (last.code_before is not None and not last.closes)
    if inside:
        parts.append("\n" + last.fence)
    return "".join(parts)


def _good_break(segs: list[_Seg], i: int) -> bool:
    """Whether cutting before segs[i] is a paragraph-grade boundary."""
    seg, prev = segs[i], segs[i - 1]
    if seg.sep == "":
        return False
    if seg.code_before is not None and seg.opens is None and not seg.closes:
        return prev.closes  # inside a code block only right after it closed
    return seg.blank or prev.blank or seg.opens is not None or prev.closes


def _trim(segs: list[_Seg]) -> list[_Seg]:
    """Drop blank lines (outside code) at both ends of a piece."""
    start, end = 0, len(segs)
    while start < end and segs[start].blank and segs[start].code_before is None:
        start += 1
    while end > start and segs[end - 1].blank and segs[end - 1].code_before is None:
        end -= 1
    return segs[start:end]


def split_markdown(text: str, limit: int = LIMIT) -> list[Piece]:
    """Cut `text` into pieces whose Markdown and rendered HTML are both within `limit`."""
    if limit <= _FENCE_OVERHEAD * 2:
        raise ValueError(f"limit must be more than {_FENCE_OVERHEAD * 2}")
    segs = _segments(text.replace("\r\n", "\n"), limit - _FENCE_OVERHEAD)
    groups: list[list[_Seg]] = []
    cur: list[_Seg] = []
    for seg in segs:
        cur.append(seg)
        while len(cur) > 1 and utf16_len(_render(cur)) > limit:
            # `cur[:-1]` fits: cut at its last good boundary if that keeps half the piece.
            cut = len(cur) - 1
            for i in range(len(cur) - 1, 0, -1):
                if _good_break(cur, i):
                    if limit // 2 <= utf16_len(_render(cur[:i])) <= limit:
                        cut = i
                    break
            if cur[cut - 1].opens is not None and cut > 1:
                cut -= 1  # never end a piece with an opening fence
            groups.append(cur[:cut])
            cur = cur[cut:]
    if cur:
        groups.append(cur)
    pieces: list[Piece] = []
    for group in groups:
        group = _trim(group)
        if not group:
            continue
        source = _render(group)
        if group[0].sep == "" and group[0].code_before is None:
            source = source.lstrip()
        body = markdown_to_html(source)
        if not html_to_text(body).strip():
            if not source.strip():
                continue
            body = escape(source)  # e.g. an empty code block: show the source
        pieces.append(Piece(body, source))
    return pieces
