"""Logging: stdlib only, one line per event, secrets scrubbed from every line."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable

from .config import Settings
from .secrets import Scrubber, known_secrets


class RedactSecrets(logging.Filter):
    """Replaces any configured secret in a record (libraries log URLs with tokens in them)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self._scrubber = Scrubber(secrets)
        self.secrets = self._scrubber.secrets

    def scrub(self, text: str) -> str:
        return self._scrubber.text(text)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            clean = self.scrub(message)
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = self.scrub(record.exc_text)
            if clean != message:
                record.msg, record.args = clean, None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info or record.exc_text:
            data["exc"] = record.exc_text or self.formatException(record.exc_info)  # type: ignore[arg-type]
        return json.dumps(data, ensure_ascii=False)


def configure(settings: Settings, stream=None) -> logging.Handler:
    """Install one stderr handler on the root logger with the secret filter."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    handler.addFilter(RedactSecrets(known_secrets(settings)))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_bub_bot", False):
            root.removeHandler(old)
    handler._bub_bot = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    # Quiet chatty libraries at INFO; their warnings still show.
    for name in (
        "aiohttp.access",
        "httpx",
        "httpx2",
        "openai._base_client",
        "slack_bolt",
        "slack_sdk",
        "aiogram.event",
    ):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    return handler
