"""A file's type from its first bytes (magic numbers), never from the name the sender gave.

The name only refines text: content that is UTF-8 text named `.csv` is CSV, but a file named
`.csv` holding a PNG is a PNG."""

from __future__ import annotations

import json

_MAGIC: tuple[tuple[bytes, int, str, str], ...] = (
    (b"%PDF-", 0, "application/pdf", ".pdf"),
    (b"\x89PNG\r\n\x1a\n", 0, "image/png", ".png"),
    (b"\xff\xd8\xff", 0, "image/jpeg", ".jpg"),
    (b"GIF87a", 0, "image/gif", ".gif"),
    (b"GIF89a", 0, "image/gif", ".gif"),
    (b"OggS", 0, "audio/ogg", ".ogg"),
    (b"ID3", 0, "audio/mpeg", ".mp3"),
    (b"fLaC", 0, "audio/flac", ".flac"),
    (b"\x1aE\xdf\xa3", 0, "video/webm", ".webm"),
    (b"PK\x03\x04", 0, "application/zip", ".zip"),
    (b"\x1f\x8b", 0, "application/gzip", ".gz"),
)
_TEXT_NAMES = {
    ".csv": ("text/csv", ".csv"),
    ".tsv": ("text/tab-separated-values", ".tsv"),
    ".md": ("text/markdown", ".md"),
    ".markdown": ("text/markdown", ".md"),
    ".json": ("application/json", ".json"),
    ".py": ("text/x-python", ".py"),
    ".html": ("text/html", ".html"),
    ".htm": ("text/html", ".html"),
    ".xml": ("text/xml", ".xml"),
    ".yaml": ("text/yaml", ".yaml"),
    ".yml": ("text/yaml", ".yaml"),
    ".js": ("text/javascript", ".js"),
    ".ts": ("text/x-typescript", ".ts"),
    ".sql": ("text/x-sql", ".sql"),
    ".log": ("text/plain", ".log"),
    ".sh": ("text/x-shellscript", ".sh"),
}
OCTET = ("application/octet-stream", ".bin")


def is_text(head: bytes) -> bool:
    """UTF-8 without NUL bytes (a cut multi-byte character at the end allowed)."""
    if b"\x00" in head:
        return False
    for cut in range(4):
        try:
            head[: len(head) - cut].decode("utf-8")
            return True
        except UnicodeDecodeError:
            continue
    return False


def sniff(head: bytes, name: str = "") -> tuple[str, str]:
    """(MIME type, extension) of a file starting with `head`."""
    for magic, offset, mime, ext in _MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return mime, ext
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp", ".webp"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "audio/wav", ".wav"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"M4A ", b"M4B "):
            return "audio/mp4", ".m4a"
        return "video/mp4", ".mp4"
    if len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        return "audio/mpeg", ".mp3"
    if not head:
        return "text/plain", ".txt"
    if is_text(head):
        dot = name.rfind(".")
        known = _TEXT_NAMES.get(name[dot:].lower()) if dot >= 0 else None
        if known is not None:
            return known
        stripped = head.lstrip()
        if stripped[:1] in (b"{", b"[") and len(head) < 8192:
            try:
                json.loads(head)
                return "application/json", ".json"
            except ValueError:
                pass
        return "text/plain", ".txt"
    return OCTET


def is_texty(mime: str) -> bool:
    """Text the model can read inline (text, code, CSV, JSON, Markdown)."""
    return mime.startswith("text/") or mime == "application/json"
