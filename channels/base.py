"""The contract every chat platform implements (Telegram, Slack, the terminal).

Inbound: a channel turns a platform event into an `Inbound` and awaits
`runtime.receive(inbound)`; only after that returns (the message is on disk) does it
acknowledge the platform (HTTP 200, Socket Mode ack, next polling offset).

Outbound: the runtime asks the channel to `split` the model's text into platform-sized
pieces and `send`s them one by one, recording each piece it delivered, so a restart resumes
delivery at the first piece not yet sent. A channel says when a request that may post the
piece leaves (`request_leaving`, channels/sending.py): a send cancelled after that is never
sent again, one cancelled while it waited for its turn is.

Streaming (optional, `Streams`): a channel that can show a reply while the model writes it
gets a `ReplyStream` per reply. The runtime hands it the text so far (throttled per
conversation), what the bot is doing between steps, and at the end delivers the final pieces
through it, so the partial message becomes the answer instead of a second copy of it. A
channel that does not stream gets only the final text, exactly as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

# Re-exported: part of the contract (see channels/sending.py).
from .sending import SendState, request_leaving, request_refused, watch_send  # noqa: F401


@dataclass(frozen=True, slots=True)
class Sender:
    """Who sent a message."""

    id: str
    name: str = ""
    username: str | None = None
    is_bot: bool = False


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file that came with a message, as the platform describes it (nothing downloaded).

    It is stored with the message before the platform is acknowledged; the runtime fetches
    it in the turn through the channel (`FetchesFiles`), so a crash or a failed download is
    retried on resume. Everything the sender chose (`name`, `mime`) is only a hint: the core
    never uses it as a path and sniffs the type from the content."""

    kind: str
    """"file", "image", "voice", "audio" or "video"."""
    ref: dict[str, Any]
    """Opaque to the core, JSON-serialisable: what the channel needs to fetch the bytes
    (Telegram file_id, Slack file id + url). Holds no secret."""
    name: str = ""
    mime: str = ""
    size: int | None = None
    duration: float | None = None
    """Seconds, for voice/audio/video when the platform says."""
    error: str = ""
    """Set by the channel when it knows up front the file cannot be fetched (over the
    platform's own download limit): the model gets this note instead."""

    def to_json(self) -> dict[str, Any]:
        """The description stored in the message entry's meta."""
        data: dict[str, Any] = {"kind": self.kind, "ref": self.ref, "name": self.name}
        for key in ("mime", "size", "duration", "error"):
            value = getattr(self, key)
            if value not in (None, ""):
                data[key] = value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attachment:
        """The inverse of `to_json` (unknown keys ignored)."""
        size = data.get("size")
        duration = data.get("duration")
        return cls(
            kind=str(data.get("kind") or "file"),
            ref=dict(data.get("ref") or {}),
            name=str(data.get("name") or ""),
            mime=str(data.get("mime") or ""),
            size=int(size) if isinstance(size, int | float) else None,
            duration=float(duration) if isinstance(duration, int | float) else None,
            error=str(data.get("error") or ""),
        )


class FetchFailed(Exception):
    """A file could not be fetched. `retry`: a later attempt may work (network, 5xx)."""

    def __init__(self, reason: str, *, retry: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry = retry


@runtime_checkable
class FetchesFiles(Protocol):
    """Optional: a channel whose messages carry files (`Inbound.attachments`)."""

    def fetch(self, ref: dict[str, Any], max_bytes: int) -> AsyncIterator[bytes]:
        """The file's bytes in chunks (an async generator). Raises `FetchFailed`; stops with
        `FetchFailed` once more than `max_bytes` came (the caller also counts)."""


@runtime_checkable
class SendsFiles(Protocol):
    """Optional: a channel that can post a file into a conversation (`send_file`)."""

    async def send_file(
        self, target: dict[str, Any], name: str, data: bytes, mime: str, caption: str | None
    ) -> list[str]:
        """Post `data` as file `name` to `target`; returns the platform ids. Raises
        DeliveryError (not posted) or DeliveryUnknown (may have been posted)."""


@dataclass(frozen=True, slots=True)
class HistoryMessage:
    """A message from before the bot joined a conversation (a Slack thread it is first
    mentioned in): put on the new tape before the message that brought the bot in."""

    role: str
    """"user", or "assistant" for the bot's own earlier messages."""
    author: str
    text: str


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
    attachments: tuple[Attachment, ...] = ()
    """Files that came with the message, fetched later in the turn (`FetchesFiles`)."""
    history: tuple[HistoryMessage, ...] = ()
    """What the conversation said before the bot was in it; written before the message,
    only on a tape that has nothing on it yet."""
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

    async def decide(self, click: ApprovalClick) -> str:
        """Store a person's decision of an approval request (once: deduplicated, it wakes
        the session like a message); returns one of the `CLICK_*` outcomes."""

    async def move_session(self, old: str, new: str) -> None:
        """Messages for session `new` continue the conversation (tape) of session `old`."""

    def note_inbound(self, channel: str, outcome: str) -> None:
        """Count a message that was not stored: "ignored" (not for us), "denied" (not
        allowed), "malformed" (unusable input) or "unauthorized" (failed the signature or
        secret check)."""

    def leader(self, name: str) -> Leadership:
        """Leadership of job `name` (e.g. `telegram:poller:<bot id>`): with several replicas
        on one database, one of them runs the job at a time; a single process always leads."""

    async def broadcast(self, topic: str, data: str) -> None:
        """Tell the other replicas on this database `data` (short text, under 7900 bytes with
        the topic) under `topic` (one word, e.g. the channel's name). Best effort, never
        raises; a single process sends nothing (it has nobody to tell)."""

    def subscribe(self, topic: str, callback: Callable[[str], None]) -> None:
        """Call `callback(data)` (in the event loop; it must not block) for every broadcast
        of `topic` by another replica, from when the runtime starts."""


class Leadership(Protocol):
    """A job only one replica runs at a time (Telegram long polling): `async with
    runtime.leader(name) as lead` waits until this replica leads; run the job inside until
    `lead.lost` is set."""

    lost: asyncio.Event
    """Set when the lead was lost (this replica stalled and another one took over): stop the
    job at once and enter again to stand by."""

    async def __aenter__(self) -> Leadership:
        """Wait until this replica leads (cancel it to stop waiting)."""

    async def __aexit__(self, *exc: object) -> None:
        """Stop leading; a replica standing by takes over at once."""


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


class ReplyStream(Protocol):
    """One reply shown while the model writes it (see `Streams`).

    The runtime calls these one at a time, never concurrently, in this order: any number of
    `update` / `status` / `reset` while the turn runs, then `deliver` for each final piece,
    then `end`. Text is the model's Markdown; formatting it for the platform (and cutting it
    only where that is safe: never inside a UTF-16 pair, a tag, an entity, or leaving a code
    block open) is the stream's job. Failures raise as `send` does; the runtime logs them and
    the final answer is still delivered.

    Optional: `final_ready()` (synchronous), called once the answer is complete, before the
    runtime waits for an update in flight: a stream whose updates wait for the platform's
    budget drops the one that has not gone out yet, so the answer does not wait behind it.
    """

    interval: float
    """Seconds between two updates this platform wants for this conversation by default
    (`BUB_STREAM_INTERVAL_MS` overrides it; the stream itself still never exceeds the
    platform's limits)."""

    shown: list[str | None]
    """Platform ids of the messages that show partial text now, one per message the reply
    takes (None for a message already holding its final piece). The runtime records them
    on the tape as they appear, so that after a crash the next process can take them over
    (`Streams.stream(shown=...)`)."""

    async def update(self, text: str) -> bool:
        """Show `text`, the current step's answer so far. Within a step it only grows; a
        text that does not extend the last one starts over (a new step). False: held back
        for now (too little to post a message yet); call again later with the newest text."""

    async def status(self, text: str) -> None:
        """Show what the bot is doing instead of text ("using fs.read…"): the text of a step
        that calls tools is not the answer."""

    async def reset(self) -> None:
        """What was shown for the current step is void (the model is asked again)."""

    async def deliver(self, index: int, piece: str) -> list[str] | None:
        """Make piece `index` of the final answer (from `split`) what the stream shows, and
        return its platform ids as `send` would; None: the stream holds nothing for this
        piece and the runtime `send`s it. Raises DeliveryError / DeliveryUnknown like `send`."""

    async def end(self, pieces: int) -> list[str]:
        """The final answer's `pieces` pieces are delivered: take away what is still shown
        beyond them (a draft, a message the final text did not need). Returns the ids of the
        messages removed."""


@runtime_checkable
class Streams(Protocol):
    """Optional: a channel that shows replies while they are written."""

    def stream(
        self, target: dict[str, Any], shown: Sequence[str | None] = ()
    ) -> ReplyStream | None:
        """A stream for one reply to `target`; None when this target cannot stream (the
        reply is then sent as usual). `shown`: message ids a stream to this target left
        behind (a crash mid-stream, in this or another process): the new stream takes them
        over, so the final answer replaces the partial text instead of following it."""


@runtime_checkable
class Recalls(Protocol):
    """Optional: a channel whose platform can be asked whether a piece was posted.

    Every piece goes out with a delivery `key` the platform keeps with the message (Slack:
    the message `metadata`); when the runtime resumes a piece whose fate it never recorded,
    it asks once (`recall`) before posting again. Telegram cannot be asked: its pieces are
    posted again (at least once)."""

    async def send_keyed(self, target: dict[str, Any], piece: str, key: str) -> list[str]:
        """`send`, with `key` kept on the posted message."""

    async def recall(self, target: dict[str, Any], key: str) -> list[str] | None:
        """The ids of the message posted with `key` near `target`; [] when it is not there;
        None when the platform could not be asked (then the piece is posted again)."""


@runtime_checkable
class Approvals(Protocol):
    """Optional: a channel that shows approval requests with Approve / Deny buttons.

    A press becomes an `ApprovalClick` the channel hands to `runtime.decide` (before it
    acknowledges the platform); what it answers the presser follows the returned outcome."""

    async def ask(self, target: dict[str, Any], request: dict[str, Any]) -> list[str]:
        """Post `request` (its `text`, `calls`, `id`, `digest`) with the buttons; returns the
        platform message ids, as `send` does. Raises DeliveryError like `send`."""

    async def settle(
        self, target: dict[str, Any], ids: list[str], request: dict[str, Any], text: str
    ) -> None:
        """The request was decided: replace its buttons (messages `ids`) by `text`."""


@dataclass(frozen=True, slots=True)
class ApprovalClick:
    """A person's Approve / Deny press (or `/approve`, `/deny`) for one request."""

    channel: str
    session_id: str
    request_id: str
    digest: str
    """The digest the button carried; it must match the request's (else forged)."""
    decision: str
    """`approve` or `deny`."""
    user: Sender
    key: str = ""
    """The platform's id of the press (a re-delivery is recognised by it); optional."""


CLICK_APPROVED = "approve"
CLICK_DENIED = "deny"
CLICK_ALREADY = "already"
"""Decided before (another click, the expiry): nothing runs twice."""
CLICK_EXPIRED = "expired"
CLICK_NOT_ALLOWED = "not_allowed"
"""The presser may not decide (BUB_APPROVERS): refused, changes nothing."""
CLICK_UNKNOWN = "unknown"
"""No such request in that conversation, or a digest that does not match: a forged or
replayed press (4xx / an ignored ack, logged as a warning)."""


def click_note(outcome: str) -> str:
    """What a presser is told (ephemeral in Slack, the callback answer in Telegram)."""
    return {
        CLICK_APPROVED: "Approved.",
        CLICK_DENIED: "Denied.",
        CLICK_ALREADY: "Already decided.",
        CLICK_EXPIRED: "This request expired.",
        CLICK_NOT_ALLOWED: "You may not decide this request.",
        CLICK_UNKNOWN: "Unknown request.",
    }.get(outcome, outcome)


@runtime_checkable
class Announces(Protocol):
    """Optional: a channel with a page people open (the web chat) says where it is."""

    def announce(self, base_url: str) -> str:
        """One line `serve` prints once it listens on `base_url`."""


@contextlib.asynccontextmanager
async def no_indicator() -> AsyncIterator[None]:
    """A `working()` that shows nothing."""
    yield
