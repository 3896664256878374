"""A small in-process channel for runtime tests: implements the `Channel` contract.

It records every piece sent per target, can cut replies into fixed-size pieces, can be told
to fail the next sends with `DeliveryError` / `DeliveryUnknown`, and can hold sends behind a
gate (to stop "between the model's answer and its delivery").

    channel = RuntimeChannel()
    runtime = Runtime(settings, store, agent, {channel.name: channel})
    await runtime.receive(channel.inbound("hello", chat="a"))
    await channel.wait_sent("a", 1)
    assert channel.texts("a") == ["echo: hello"]
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bub_bot.runtime import Runtime
from bub_bot.tape import SQLiteTapeStore, Tape, TapeEntry
from channels.base import (
    DeliveryError,
    DeliveryUnknown,
    Inbound,
    Received,
    RuntimeLike,
    Sender,
    request_leaving,
)
from tests.fakes.openai_server import FakeOpenAI


@dataclass(frozen=True, slots=True)
class SentPiece:
    target: str
    text: str
    ids: tuple[str, ...]


class RuntimeChannel:
    """Records sends per target (`reply_target["chat"]`); no network."""

    def __init__(self, name: str = "test", *, piece_size: int | None = None) -> None:
        self.name = name
        self.piece_size = piece_size
        """Cut replies into pieces of at most this many characters (None: one piece)."""
        self.sent: dict[str, list[SentPiece]] = defaultdict(list)
        self.log: list[SentPiece] = []
        """Every piece delivered, in delivery order, all targets."""
        self.attempts = 0
        self.gate: asyncio.Event | None = None
        """When set to an unset Event, every send waits for it before delivering."""
        self.waiting = 0
        """How many sends are waiting at the gate now."""
        self.on_send: Callable[[str, str], None] | None = None
        """Called with (chat, piece) after each delivered piece (benchmarks wait on it)."""
        self.working_now: dict[str, int] = defaultdict(int)
        self.working_total = 0
        self.runtime: RuntimeLike | None = None
        self.start_gate: asyncio.Event | None = None
        """When set, `start()` waits for it (to look at a server that is not ready yet)."""
        self.starting = asyncio.Event()
        self.started = False
        self.stopped = False
        self._failures: deque[BaseException | None] = deque()
        self._changed = asyncio.Condition()
        self._keys = itertools.count(1)
        self._ids = itertools.count(1)

    # -- test helpers --------------------------------------------------------------------------
    def inbound(
        self,
        text: str,
        chat: str = "a",
        *,
        key: str | None = None,
        extra_keys: tuple[str, ...] = (),
        bot_names: tuple[str, ...] = (),
        sender: str = "u1",
    ) -> Inbound:
        """A message from `sender` in chat `chat` (session `<name>:<chat>`)."""
        key = key or f"k{next(self._keys)}"
        return Inbound(
            channel=self.name,
            session_id=f"{self.name}:{chat}",
            delivery_key=key,
            message_id=f"m-{key}",
            sender=Sender(id=sender, name=sender.upper()),
            text=text,
            reply_target={"chat": chat},
            extra_keys=extra_keys,
            bot_names=bot_names,
        )

    async def say(self, text: str, chat: str = "a", **kwargs: Any) -> Received:
        """Build an inbound and hand it to the runtime, as a platform handler would."""
        assert self.runtime is not None, "start() the channel or set .runtime first"
        return await self.runtime.receive(self.inbound(text, chat, **kwargs))

    def fail_next(self, *outcomes: BaseException | None) -> None:
        """The next sends raise these in order (None: that send succeeds)."""
        self._failures.extend(outcomes)

    def texts(self, chat: str = "a") -> list[str]:
        return [p.text for p in self.sent[chat]]

    def hold(self) -> asyncio.Event:
        """Make sends wait at a gate; `.set()` the returned event to let them through."""
        self.gate = asyncio.Event()
        return self.gate

    async def wait_sent(self, chat: str, count: int, timeout: float = 10.0) -> list[str]:
        """Wait until `chat` has at least `count` pieces."""
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(lambda: len(self.sent[chat]) >= count)
        return self.texts(chat)

    async def wait_waiting(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until `count` sends are held at the gate."""
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(lambda: self.waiting >= count)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- the Channel contract ------------------------------------------------------------------
    async def start(self, runtime: RuntimeLike) -> None:
        self.runtime = runtime
        self.starting.set()
        if self.start_gate is not None:
            await self.start_gate.wait()
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def routes(self) -> list[tuple[str, str, Callable[..., Awaitable[Any]]]]:
        return []

    def split(self, text: str) -> list[str]:
        if not self.piece_size:
            return [text]
        size = self.piece_size
        return [text[i : i + size] for i in range(0, len(text), size)] or [""]

    async def send(self, target: dict[str, Any], piece: str) -> list[str]:
        self.attempts += 1
        chat = str(target.get("chat"))
        if self.gate is not None and not self.gate.is_set():
            self.waiting += 1
            await self._notify()
            try:
                await self.gate.wait()
            finally:
                self.waiting -= 1
        if self._failures:
            failure = self._failures.popleft()
            if failure is not None:
                raise failure
        request_leaving()  # shown now: a send cancelled from here on may be out
        ids = (f"p{next(self._ids)}",)
        record = SentPiece(chat, piece, ids)
        self.sent[chat].append(record)
        self.log.append(record)
        if self.on_send is not None:
            self.on_send(chat, piece)
        await self._notify()
        return list(ids)

    @contextlib.asynccontextmanager
    async def working(self, target: dict[str, Any]) -> AsyncIterator[None]:
        chat = str(target.get("chat"))
        self.working_now[chat] += 1
        self.working_total += 1
        try:
            yield
        finally:
            self.working_now[chat] -= 1


# -- runtime test helpers (shared by the runtime/command tests) ----------------------------------------------------------------------


@pytest.fixture
async def make_runtime(store: SQLiteTapeStore, agent) -> AsyncIterator[Callable[..., Any]]:
    """`make_runtime(channel=None, registry=None, **settings)` -> (runtime, channel)."""
    made: list[Runtime] = []

    def make(
        channel: RuntimeChannel | None = None, registry=None, **overrides: Any
    ) -> tuple[Runtime, RuntimeChannel]:
        channel = channel or RuntimeChannel()
        built = agent(registry, **overrides)
        runtime = Runtime(built.settings, store, built, {channel.name: channel})
        channel.runtime = runtime
        made.append(runtime)
        return runtime, channel

    yield make
    for runtime in made:
        await runtime.shutdown(grace=2)


def tape_of(runtime: Runtime, session_id: str) -> Tape:
    return Tape.for_session(runtime.store, session_id, runtime.settings.workspace)


async def until(
    predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.005
) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 (polls foreign state)
            await asyncio.sleep(interval)


async def idle(runtime: Runtime, *session_ids: str, timeout: float = 10.0) -> None:
    for session_id in session_ids:
        await runtime.wait_idle(session_id, timeout)


async def inbound_users(tape: Tape) -> list[TapeEntry]:
    """The user messages as received (not copies made after an anchor)."""
    found = await tape.query(kinds=["message"], names=["user"])
    return [e for e in found if e.meta.get("inbound") and not e.meta.get("copy_of")]


async def events(tape: Tape, name: str) -> list[TapeEntry]:
    return await tape.query(kinds=["event"], names=[name])


async def done_coverage(tape: Tape, ids: list[int]) -> dict[int, int]:
    """How many `inbound.done` ranges (previous through, through] contain each id."""
    throughs = [e.payload["data"]["through"] for e in await events(tape, "inbound.done")]
    assert throughs == sorted(throughs), f"inbound.done went backwards: {throughs}"
    counts = dict.fromkeys(ids, 0)
    low = 0
    for high in throughs:
        for i in ids:
            if low < i <= high:
                counts[i] += 1
        low = high
    return counts


async def final_replies(tape: Tape) -> list[TapeEntry]:
    found = await tape.query(kinds=["message"], names=["assistant"])
    return [e for e in found if "turn" in e.meta]


def user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def requests_with(fake: FakeOpenAI, content: str) -> int:
    return sum(content in user_texts(r.body) for r in fake.completion_requests())


def old_date(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat(timespec="microseconds")


def user_entry(channel: RuntimeChannel, text_: str, chat: str, key: str, **extra: Any) -> TapeEntry:
    """The entry `receive` writes for a message (to build the state a crash leaves)."""
    meta = {
        "inbound": True,
        "channel": channel.name,
        "delivery_key": key,
        "message_id": f"m-{key}",
        "sender": {"id": "u1", "name": "U1"},
        "reply_target": {"chat": chat},
    }
    return TapeEntry("message", {"role": "user", "content": text_}, meta, **extra)


__all__ = [
    "DeliveryError",
    "DeliveryUnknown",
    "RuntimeChannel",
    "SentPiece",
    "done_coverage",
    "events",
    "final_replies",
    "idle",
    "inbound_users",
    "make_runtime",
    "old_date",
    "requests_with",
    "tape_of",
    "until",
    "user_entry",
    "user_texts",
]
