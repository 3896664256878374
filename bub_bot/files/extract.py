"""What the model gets of a saved file: its text (inline up to a limit), the text of a PDF
(pypdf), or the image itself as a `data:` URL."""

from __future__ import annotations

import base64
import io
import logging
from pathlib import Path

from .inbox import read_head

log = logging.getLogger("bub_bot.files")


def text_of(workspace: Path, relpath: str, limit: int) -> tuple[str, bool]:
    """The first `limit` characters of a text file, and whether there is more."""
    raw = read_head(workspace, relpath, limit * 4 + 4)
    text = raw.decode("utf-8", errors="replace")
    return text[:limit], len(text) > limit


def pdf_text(workspace: Path, relpath: str, max_bytes: int, limit: int) -> tuple[str, bool]:
    """The text of a PDF, page by page, cut at `limit` characters; ("", False) if it has
    none (scanned images) or cannot be read."""
    from pypdf import PdfReader  # imported here: only a PDF pays for loading it
    from pypdf.errors import PyPdfError

    data = read_head(workspace, relpath, max_bytes)
    parts: list[str] = []
    total = 0
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            reader.decrypt("")
        for number, page in enumerate(reader.pages, 1):
            text = (page.extract_text() or "").strip()
            if not text:
                continue
            parts.append(f"--- page {number} ---\n{text}")
            total += len(parts[-1])
            if total > limit:
                break
    except (PyPdfError, ValueError, KeyError, TypeError, NotImplementedError) as exc:
        log.warning("files.pdf unreadable path=%s: %s", relpath, exc)
        return "", False
    joined = "\n".join(parts)
    return joined[:limit], len(joined) > limit


def data_url(workspace: Path, relpath: str, mime: str, max_bytes: int) -> str:
    """The file as a `data:` URL (the caller checked its size)."""
    raw = read_head(workspace, relpath, max_bytes)
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"
