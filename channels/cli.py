"""The terminal channel: the same pipeline as Slack and Telegram, for trying bub-bot locally.

On a terminal the answer is printed as the model writes it (`CliStream`); what a tool step
wrote stays on screen, followed by a dim line naming the tools. When stdout is not a
terminal (a pipe, a file) nothing is streamed, so the bytes are exactly the final answers.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TextIO

from .base import ApprovalClick, Inbound, RuntimeLike, Sender

DIM, PLAIN = "\x1b[2m", "\x1b[0m"


class CliChannel:
    """Prints replies to a stream; `inbound()` builds the message a user typed."""

    name = "cli"

    def __init__(self, out: TextIO | None = None, *, user: str = "you") -> None:
        self.out = out or sys.stdout
        self.user = user
        self.sent: list[str] = []
        self.on_send: Callable[[str], None] | None = None
        self.asking: list[tuple[str, dict[str, Any]]] = []
        """Approval requests posted and not answered yet: (session, request); the terminal
        asks y/N for each after the turn (`bub_bot/cli.py`)."""

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
        print(piece, file=self.out, flush=True)
        return self._sent(piece)

    async def ask(self, target: dict[str, Any], request: dict[str, Any]) -> list[str]:
        """An approval request: printed; the prompt loop asks y/N (channels.base.Approvals)."""
        text = request["text"].rsplit("\nReply /approve", 1)[0]
        print(text, file=self.out, flush=True)
        self.asking.append((str(target.get("session", "local")), request))
        return self._sent(text)

    async def settle(
        self, target: dict[str, Any], ids: list[str], request: dict[str, Any], text: str
    ) -> None:
        print(text, file=self.out, flush=True)

    def click(self, session: str, request: dict[str, Any], answer: str) -> ApprovalClick:
        """The decision a y/N answer makes (anything but y/yes denies)."""
        approve = answer.strip().lower() in ("y", "yes")
        return ApprovalClick(
            channel=self.name,
            session_id=f"cli:{session}",
            request_id=str(request["id"]),
            digest=str(request["digest"]),
            decision="approve" if approve else "deny",
            user=Sender(id=self.user, name=self.user),
        )

    def _sent(self, piece: str) -> list[str]:
        self.sent.append(piece)
        if self.on_send is not None:
            self.on_send(piece)
        return [uuid.uuid4().hex[:8]]

    def stream(self, target: dict[str, Any], shown: Sequence[str | None] = ()) -> CliStream | None:
        """Print the answer as it is written, on a terminal only (a pipe gets the final
        text alone, byte for byte as without streaming)."""
        isatty = getattr(self.out, "isatty", None)
        return CliStream(self) if callable(isatty) and isatty() else None

    @contextlib.asynccontextmanager
    async def working(self, target: dict[str, Any]) -> AsyncIterator[None]:
        yield


class CliStream:
    """One answer printed while it is written (see the module)."""

    interval = 0.05
    """A terminal takes every change; 50 ms batches keep the writes few."""

    def __init__(self, channel: CliChannel) -> None:
        self.channel = channel
        self.shown: list[str | None] = []  # nothing printed can be taken over later
        self._printed = ""
        """The current step's text as far as it is on screen."""
        self._open = False
        """The cursor is not at the start of a line."""

    def _write(self, text: str) -> None:
        if text:
            self.channel.out.write(text)
            self.channel.out.flush()
            self._open = not text.endswith("\n")

    def _newline(self) -> None:
        if self._open:
            self._write("\n")

    async def update(self, text: str) -> bool:
        if text.startswith(self._printed):
            self._write(text[len(self._printed) :])
        else:  # a new step: what the last one wrote stays above
            self._newline()
            self._write(text)
        self._printed = text
        return True

    async def status(self, text: str) -> None:
        self._newline()
        self._write(f"{DIM}… {text}{PLAIN}\n")
        self._printed = ""

    async def reset(self) -> None:
        if self._printed:
            self._newline()
            self._write(f"{DIM}(asking the model again){PLAIN}\n")
        self._printed = ""

    async def deliver(self, index: int, piece: str) -> list[str] | None:
        if index != 0 or not self._printed:
            self._newline()
            return None  # printed by `send`
        await self.update(piece)  # the rest of the piece (or all of it, if it differs)
        self._write("\n")
        self._printed = ""
        return self.channel._sent(piece)

    async def end(self, pieces: int) -> list[str]:
        return []
