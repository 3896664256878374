"""The terminal channel: the same pipeline as Slack and Telegram, for trying bub-bot locally."""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TextIO

from .base import Inbound, RuntimeLike, Sender


class CliChannel:
    """Prints replies to a stream; `inbound()` builds the message a user typed."""

    name = "cli"

    def __init__(self, out: TextIO | None = None, *, user: str = "you") -> None:
        self.out = out or sys.stdout
        self.user = user
        self.sent: list[str] = []
        self.on_send: Callable[[str], None] | None = None

    def inbound(self, text: str, session: str = "local") -> Inbound:
        """A typed line as an inbound message of session `cli:<session>`."""
        key = uuid.uuid4().hex
        return Inbound(
            channel=self.name,
            session_id=f"cli:{session}",
            delivery_key=key,
            message_id=key,
            sender=Sender(id=self.user, name=self.user),
            text=text,
            reply_target={"session": session},
        )

    async def start(self, runtime: RuntimeLike) -> None:
        return None

    async def stop(self) -> None:
        return None

    def routes(self) -> list[tuple[str, str, Any]]:
        return []

    def split(self, text: str) -> list[str]:
        return [text]

    async def send(self, target: dict[str, Any], piece: str) -> list[str]:
        self.sent.append(piece)
        print(piece, file=self.out, flush=True)
        if self.on_send is not None:
            self.on_send(piece)
        return [uuid.uuid4().hex[:8]]

    @contextlib.asynccontextmanager
    async def working(self, target: dict[str, Any]) -> AsyncIterator[None]:
        yield
