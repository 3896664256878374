"""Voice and audio to text through the OpenAI-compatible `/v1/audio/transcriptions`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .inbox import read_head

log = logging.getLogger("bub_bot.files")


class NotTranscribed(Exception):
    """The audio was not transcribed; `reason` is the note the model gets."""

    def __init__(self, reason: str, *, retry: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry = retry


class Transcriber:
    """Transcribes a saved audio file with the model provider's client."""

    def __init__(self, model: str | None, client: Callable[[], Any]) -> None:
        self.model = model
        """None: off (BUB_TRANSCRIBE_MODEL=off)."""
        self._client = client
        self._missing = False
        """The provider answered 404 once: it has no transcriptions endpoint."""

    @property
    def enabled(self) -> bool:
        return self.model is not None and not self._missing

    async def transcribe(self, workspace: Path, relpath: str, max_bytes: int) -> str:
        """The transcript of `inbox/...`; raises NotTranscribed with the reason."""
        if not self.enabled:
            raise NotTranscribed("voice not transcribed: transcription is off")
        import openai

        data = read_head(workspace, relpath, max_bytes)
        name = relpath.rsplit("/", 1)[-1]
        try:
            result = await self._client().audio.transcriptions.create(
                model=self.model, file=(name, data)
            )
        except openai.NotFoundError as exc:
            self._missing = True
            log.warning("transcribe.unavailable model=%s: the provider has no endpoint", self.model)
            raise NotTranscribed(
                "voice not transcribed: the provider offers no transcription"
            ) from exc
        except openai.BadRequestError as exc:
            raise NotTranscribed(
                f"voice not transcribed: the provider refused it ({exc.status_code})"
            ) from exc
        except (openai.APIConnectionError, openai.APIStatusError) as exc:
            raise NotTranscribed(
                f"voice not transcribed: {type(exc).__name__}", retry=True
            ) from exc
        text = result if isinstance(result, str) else getattr(result, "text", "")
        return str(text or "").strip()
