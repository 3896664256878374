"""Markdown (as models write it) -> Slack mrkdwn, cut into pieces Slack accepts.

Slack's `text` field is not Markdown: bold is `*x*`, italics `_x_`, strike `~x~`, links
`<url|label>`, no headings, and `&`, `<`, `>` must be escaped as HTML entities. Slack shows a
message best below 4 000 characters, so `split_mrkdwn` cuts at paragraph, then line, then word
boundaries into pieces under a byte budget, closing and reopening code fences so every piece is
well formed on its own.

Both functions are pure and deterministic: after a restart the runtime re-splits the same text
and resumes at the first piece not yet sent.
"""

from __future__ import annotations

import re

MAX_PIECE_BYTES = 3900
"""Budget per piece (UTF-8 bytes, after escaping); Slack's soft limit is 4 000."""

FENCE = "```"
_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_HEADING_RE = re.compile(r"^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$")
_HR_RE = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_QUOTE_RE = re.compile(r"^ {0,3}>[ ]?(.*)$")
_BULLET_RE = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_ORDERED_RE = re.compile(r"^(\s*)(\d{1,9})[.)]\s+(.*)$")
_TASK_RE = re.compile(r"^\[([ xX])\]\s+(.*)$")
_TABLE_SEP_RE = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")

_CODE_SPAN_RE = re.compile(r"(`+)(.+?)\1")
_LINK_RE = re.compile(r"!?\[([^\]\n]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"\n]*\")?\s*\)")
_AUTOLINK_RE = re.compile(r"<((?:https?|mailto):[^>\s]+)>")
_BACKSLASH_RE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!~|<>&])")
_BOLD_ITALIC_RE = re.compile(r"(\*\*\*|___)(?=\S)(.+?)(?<=\S)\1")
_BOLD_RE = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_STRIKE_RE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_ITALIC_RE = re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])")
_TOKEN_RE = re.compile("\x00(\\d+)\x00")
_BOLD_MARK = "\x01"


def escape(text: str) -> str:
    """Slack's three control characters as entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_mrkdwn(markdown: str) -> str:
    """Convert Markdown to Slack mrkdwn (code fences normalised to bare ``` lines)."""
    text = markdown.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    text = text.replace(_BOLD_MARK, "")
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE_RE.match(line)
        if fence:
            marker = fence.group(1)
            out.append(FENCE)
            i += 1
            while i < len(lines):
                close = _FENCE_RE.match(lines[i])
                if (
                    close
                    and close.group(1)[0] == marker[0]
                    and len(close.group(1)) >= len(marker)
                    and not close.group(2).strip()
                ):
                    break
                out.append(escape(lines[i]))
                i += 1
            out.append(FENCE)  # closes an unclosed fence at the end too
            i += 1
            continue
        if _is_table_start(lines, i):
            out.append(FENCE)
            while i < len(lines) and lines[i].strip().startswith("|"):
                out.append(escape(lines[i].strip()))
                i += 1
            out.append(FENCE)
            continue
        out.append(_block_line(line))
        i += 1
    return "\n".join(out).strip("\n")


def _is_table_start(lines: list[str], i: int) -> bool:
    return (
        lines[i].strip().startswith("|")
        and i + 1 < len(lines)
        and bool(_TABLE_SEP_RE.match(lines[i + 1]))
        and "|" in lines[i + 1]
    )


def _block_line(line: str) -> str:
    if not line.strip():
        return ""
    if _HR_RE.match(line):
        return "──────────"
    heading = _HEADING_RE.match(line)
    if heading:
        body = heading.group(1).replace("**", "").replace("__", "")
        inner = _inline(body)
        return f"*{inner}*" if inner else ""
    quote = _QUOTE_RE.match(line)
    if quote:
        rest = _block_line(quote.group(1))
        return f"> {rest}" if rest else ">"
    bullet = _BULLET_RE.match(line)
    if bullet:
        indent = _indent(bullet.group(1))
        body = bullet.group(2)
        task = _TASK_RE.match(body)
        if task:
            box = "☐" if task.group(1) == " " else "☑"
            return f"{indent}{box} {_inline(task.group(2))}"
        return f"{indent}• {_inline(body)}"
    ordered = _ORDERED_RE.match(line)
    if ordered:
        return f"{_indent(ordered.group(1))}{ordered.group(2)}. {_inline(ordered.group(3))}"
    return _inline(line.rstrip())


def _indent(spaces: str) -> str:
    width = len(spaces.expandtabs(4))
    return "    " * (width // 2) if width else ""


def _inline(text: str) -> str:
    """Inline Markdown -> mrkdwn: code spans and links kept whole, the rest escaped."""
    saved: list[str] = []

    def keep(value: str) -> str:
        saved.append(value)
        return f"\x00{len(saved) - 1}\x00"

    text = _CODE_SPAN_RE.sub(lambda m: keep(f"`{escape(m.group(2).strip() or m.group(2))}`"), text)
    text = _BACKSLASH_RE.sub(lambda m: keep(escape(m.group(1))), text)
    text = _LINK_RE.sub(lambda m: keep(_link(m.group(2), m.group(1))), text)
    text = _AUTOLINK_RE.sub(lambda m: keep(_link(m.group(1), "")), text)
    text = escape(text)
    text = _BOLD_ITALIC_RE.sub(lambda m: f"{_BOLD_MARK}_{m.group(2)}_{_BOLD_MARK}", text)
    text = _BOLD_RE.sub(lambda m: f"{_BOLD_MARK}{m.group(2)}{_BOLD_MARK}", text)
    text = _STRIKE_RE.sub(r"~\1~", text)
    text = _ITALIC_RE.sub(r"_\1_", text)
    text = text.replace(_BOLD_MARK, "*")
    # Restore innermost-last: a saved value never contains another token.
    return _TOKEN_RE.sub(lambda m: saved[int(m.group(1))], text)


def _link(url: str, label: str) -> str:
    label = label.strip()
    if not re.match(r"^(https?|mailto):", url, re.IGNORECASE):
        # Relative or odd links are not clickable in Slack: show them as text.
        shown = f"{label} ({url})" if label and label != url else url
        return escape(shown)
    safe_url = url.replace("&", "&amp;").replace("<", "%3C").replace(">", "%3E")
    safe_url = safe_url.replace("|", "%7C")
    if not label or label == url:
        return f"<{safe_url}>"
    return f"<{safe_url}|{escape(label).replace('|', '¦')}>"


# --------------------------------------------------------------------------------- split
def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def split_mrkdwn(text: str, max_bytes: int = MAX_PIECE_BYTES) -> list[str]:
    """Cut mrkdwn (as `to_mrkdwn` produces it) into pieces of at most `max_bytes` bytes.

    Cuts prefer blank lines between paragraphs, then line ends, then spaces; a code block
    that has to be cut is closed at the end of a piece and reopened in the next one.
    """
    if max_bytes < 64:
        raise ValueError("max_bytes must be at least 64")
    segments = _segments(text)
    chunks: list[str] = []
    current = ""
    for sep, body, is_code in segments:
        candidate = f"{current}{sep}{body}" if current else body
        if _size(candidate) <= max_bytes:
            current = candidate
            continue
        if current:
            chunks.append(current)
            current = ""
        if _size(body) <= max_bytes:
            current = body
            continue
        pieces = _split_code(body, max_bytes) if is_code else _split_lines(body, max_bytes)
        chunks.extend(pieces[:-1])
        current = pieces[-1]
    if current:
        chunks.append(current)
    return [c for c in (c.strip("\n") for c in chunks) if c.strip()]


def _segments(text: str) -> list[tuple[str, str, bool]]:
    """(separator before, body, is_code) for each paragraph and code block."""
    segments: list[tuple[str, str, bool]] = []
    lines = text.split("\n")
    sep = ""
    buf: list[str] = []
    i = 0

    def flush() -> None:
        nonlocal sep
        if buf:
            segments.append((sep, "\n".join(buf), False))
            buf.clear()
            sep = "\n"

    while i < len(lines):
        line = lines[i]
        if line == FENCE:
            flush()
            block = [line]
            i += 1
            while i < len(lines) and lines[i] != FENCE:
                block.append(lines[i])
                i += 1
            block.append(FENCE)
            i += 1
            segments.append((sep, "\n".join(block), True))
            sep = "\n"
            continue
        if not line.strip():
            flush()
            if segments:
                sep = "\n\n"
            i += 1
            continue
        buf.append(line)
        i += 1
    flush()
    if segments:
        _, body, code = segments[0]
        segments[0] = ("", body, code)
    return segments


def _split_lines(body: str, max_bytes: int) -> list[str]:
    pieces: list[str] = []
    current = ""
    for line in body.split("\n"):
        candidate = f"{current}\n{line}" if current else line
        if _size(candidate) <= max_bytes:
            current = candidate
            continue
        if current:
            pieces.append(current)
            current = ""
        while _size(line) > max_bytes:
            head, line = _cut(line, max_bytes)
            pieces.append(head)
        current = line
    pieces.append(current)
    return pieces


def _split_code(block: str, max_bytes: int) -> list[str]:
    inner = block.split("\n")[1:-1]
    budget = max_bytes - _size(FENCE + "\n" + "\n" + FENCE)
    pieces: list[str] = []
    current: list[str] = []
    used = 0
    for line in inner:
        while _size(line) > budget:
            head, line = _cut(line, budget, words=False)
            if current:
                pieces.append("\n".join(current))
                current, used = [], 0
            pieces.append(head)
        cost = _size(line) + (1 if current else 0)
        if current and used + cost > budget:
            pieces.append("\n".join(current))
            current, used = [], 0
            cost = _size(line)
        current.append(line)
        used += cost
    if current or not pieces:
        pieces.append("\n".join(current))
    return [f"{FENCE}\n{p}\n{FENCE}" for p in pieces]


def _cut(line: str, max_bytes: int, *, words: bool = True) -> tuple[str, str]:
    """Split one over-long line: the head fits `max_bytes`, never cutting a character,
    an `&amp;`-style entity or a `<link>`, and (with `words`) preferring a space."""
    head = line.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")
    cut = len(head)
    amp = head.rfind("&", max(0, cut - 6))
    if amp != -1 and ";" not in head[amp:]:
        cut = amp
    lt = head.rfind("<", 0, cut)
    if lt > 0 and head.rfind(">", 0, cut) < lt:
        cut = lt
    if words:
        space = head.rfind(" ", 0, cut)
        if space > cut // 2:
            cut = space + 1
    if cut <= 0:
        cut = max(1, len(head))
    return line[:cut].rstrip(" ") or line[:cut], line[cut:]


def format_and_split(markdown: str, max_bytes: int = MAX_PIECE_BYTES) -> list[str]:
    """What `SlackChannel.split` does: convert, then cut."""
    pieces = split_mrkdwn(to_mrkdwn(markdown), max_bytes)
    return pieces or [escape(markdown.strip()) or "(no answer)"]
