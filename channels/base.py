"""The contract every chat platform implements (Telegram, Slack, the terminal).

Inbound: a channel turns a platform event into an `Inbound` and awaits
`runtime.receive(inbound)`; only after that returns (the message is on disk) does it
acknowledge the platform (HTTP 200, Socket Mode ack, next polling offset).

Outbound: the runtime asks the channel to `split` the model's text into platform-sized
pieces and `send`s them one by one, recording each piece it delivered, so a restart resumes
delivery at the first piece not yet sent.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Sender:
    """Who sent a message."""

    id: str
    name: str = ""
    username: str | None = None
    is_bot: bool = False


@dataclass(frozen=True, slots=True)
class Inbound:
    """One message from a chat platform, as the runtime stores it."""

    channel: str
    session_id: str
    delivery_key: str
    """The platform's id for this message, unique forever within the channel (Telegram
    `<chat_id>:<message_id>`, Slack `event_id`): re-deliveries are recognised by it."""
    message_id: str
    sender: Sender
    text: str
    reply_target: dict[str, Any]
    """Opaque to the core, JSON-serialisable: handed back to `Channel.send` (also after a
    restart, so it is stored with the message)."""
    images: tuple[str, ...] = ()
    """Image URLs (usually `data:` URLs) the model should see with the text."""
    extra_keys: tuple[str, ...] = ()
    """More dedupe keys for the same message (Slack: channel + ts, because one mention
    arrives as both `app_mention` and `message`)."""
    bot_names: tuple[str, ...] = ()
    """How users address the bot here (`@name`, `<@U123>`): a leading mention is stripped
    before commands are recognised, and `/cmd@name` is accepted."""
    workspace: Path | None = None
    """The session's workspace; None means `BUB_WORKSPACE`."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Extra platform facts to keep with the message (chat type, thread ids, ...)."""
    sent_at: float | None = None
    """When the platform says the message was sent: UNIX seconds, UTC (Telegram `date`, Slack
    `ts`); None when it gives no time (slash commands, the terminal). Messages delivered late,
    e.g. a backlog after downtime, are judged by it rather than by when they arrived."""


@dataclass(frozen=True, slots=True)
class Received:
    """What `receive` did with an inbound message."""

    new: bool
    entry_id: int | None = None

    @property
    def duplicate(self) -> bool:
        return not self.new


DENIED = "denied"
"""What a channel's message filter returns for a sender outside the allowlists."""


class DeliveryError(Exception):
    """A reply piece was not delivered and retrying it will not help."""


class DeliveryUnknown(DeliveryError):
    """The platform may or may not have posted the piece (connection lost after sending).

    The runtime records it and never re-sends it, so nobody gets the same answer twice.
    """


class RuntimeLike(Protocol):
    """What channels may call on the runtime."""

    async def receive(self, inbound: Inbound) -> Received: ...

    async def session_known(self, session_id: str) -> bool: ...

    async def move_session(self, old: str, new: str) -> None:
        """Messages for session `new` continue the conversation (tape) of session `old`."""

    def note_inbound(self, channel: str, outcome: str) -> None:
        """Count a message that was not stored: "ignored" (not for us), "denied" (not
        allowed), "malformed" (unusable input) or "unauthorized" (failed the signature or
        secret check)."""


@runtime_checkable
class Channel(Protocol):
    """A chat platform. `name` is also the prefix of its session ids."""

    name: str

    async def start(self, runtime: RuntimeLike) -> None:
        """Connect and begin delivering inbound messages to `runtime.receive`."""

    async def stop(self) -> None:
        """Stop receiving; pending sends may finish."""

    def routes(self) -> list[tuple[str, str, Callable[..., Awaitable[Any]]]]:
        """aiohttp routes (method, path, handler) the server mounts (webhook modes)."""

    def split(self, text: str) -> list[str]:
        """Format the model's text for the platform and cut it into sendable pieces."""

    async def send(self, target: dict[str, Any], piece: str) -> list[str]:
        """Send one piece; returns the platform message ids. Raises DeliveryError."""

    def working(self, target: dict[str, Any]) -> contextlib.AbstractAsyncContextManager[None]:
        """Show that a turn is running (typing, status, reaction) until the block exits."""


@runtime_checkable
class Announces(Protocol):
    """Optional: a channel with a page people open (the web chat) says where it is."""

    def announce(self, base_url: str) -> str:
        """One line `serve` prints once it listens on `base_url`."""


@contextlib.asynccontextmanager
async def no_indicator() -> AsyncIterator[None]:
    """A `working()` that shows nothing."""
    yield
