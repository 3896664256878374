"""The web chat across replicas: tell the other replicas when a conversation changed here,
and wake this replica's pages when another one says so.

A page watches its conversation through the replica it is connected to, while the turn may
run on another replica (several `serve` processes on one PostgreSQL database). The runtime's
broadcasts (`RuntimeLike.broadcast`, topic `web`) carry short JSON messages:

- `{"c": id}`: the conversation's tape changed (a message stored, an answer delivered): pages
  read the tape again.
- `{"c": id, "w": true|false, "t": turn}`: a turn started (and is still running: repeated
  every `REFRESH_SECONDS`) or ended; pages read the tape too. `turn` names the turn, so the
  late "ended" of a replica that lost the session never clears the turn of the one that took
  it over.
- `{"c": id, "p": [text, status]}`: the answer being written (`partial.Partial`), while its
  text fits in `PARTIAL_BYTES` (at most every `stream.RELAY_INTERVAL`); a longer one is not
  relayed and the final answer replaces the last one that was.

With one process (SQLite) the runtime sends nothing and the in-process hub is all there is.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import secrets
from collections.abc import AsyncIterator
from typing import Any

from channels.base import RuntimeLike

from .hub import REMOTE_WORKING_SECONDS, Hub
from .partial import CLEARED, Partial

log = logging.getLogger("channels.web")

TOPIC = "web"
PARTIAL_BYTES = 6000
"""The largest partial answer relayed (its JSON message, UTF-8), well under the 7900 bytes a
broadcast may carry."""
REFRESH_SECONDS = REMOTE_WORKING_SECONDS / 3

_CONVERSATION = re.compile(r"[A-Za-z0-9_-]{6,64}")
# A turn's name: unique across replicas (a random prefix per process) without reading the
# system's random source once per turn (a syscall each: profiled, a few % of a web turn).
_PROCESS = secrets.token_hex(4)
_TURNS = itertools.count(1)


def _encode(message: dict[str, Any]) -> str:
    data = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    try:
        data.encode()
    except UnicodeEncodeError:  # a lone surrogate in model text: escaped, still JSON
        data = json.dumps(message, separators=(",", ":"))
    return data


class Relay:
    """Broadcasts of one web channel (see the module docstring)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.runtime: RuntimeLike | None = None

    def start(self, runtime: RuntimeLike) -> None:
        """Listen to the other replicas (once per runtime)."""
        if runtime is not self.runtime:
            self.runtime = runtime
            runtime.subscribe(TOPIC, self.heard)

    async def _tell(self, message: dict[str, Any]) -> bool:
        if self.runtime is None:
            return False
        await self.runtime.broadcast(TOPIC, _encode(message))
        return True

    async def changed(self, conversation: str) -> None:
        """The conversation's tape has something new."""
        await self._tell({"c": conversation})

    async def partial(self, conversation: str, partial: Partial) -> bool:
        """The answer being written is now `partial` (CLEARED: none); False: too long to
        relay."""
        data = _encode({"c": conversation, "p": [partial.text, partial.status]})
        if self.runtime is None or len(data.encode()) > PARTIAL_BYTES:
            return False
        await self.runtime.broadcast(TOPIC, data)
        return True

    @contextlib.asynccontextmanager
    async def working(self, conversation: str) -> AsyncIterator[None]:
        """A turn runs here: say so now, again every `REFRESH_SECONDS`, and when it ends."""
        turn = f"{_PROCESS}{next(_TURNS):x}"
        await self._tell({"c": conversation, "w": True, "t": turn})
        refresh = asyncio.get_running_loop().create_task(self._refresh(conversation, turn))
        try:
            yield
        finally:
            refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresh
            await self._tell({"c": conversation, "w": False, "t": turn})

    async def _refresh(self, conversation: str, turn: str) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            await self._tell({"c": conversation, "w": True, "t": turn})

    def heard(self, data: str) -> None:
        """Another replica's message: wake this conversation's pages here."""
        try:
            message = json.loads(data)
            conversation = message["c"]
            if not isinstance(conversation, str) or not _CONVERSATION.fullmatch(conversation):
                raise ValueError("no conversation id")
            working = message.get("w")
            turn = message.get("t")
            if turn is not None and not isinstance(turn, str):
                raise ValueError("a turn that is not text")
            partial = message.get("p")
            if partial is not None:
                text, status = partial
                if not isinstance(text, str) or not isinstance(status, str):
                    raise ValueError("a partial answer that is not text")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # Its size, not its text: a relayed partial is conversation content.
            log.warning("web.relay unreadable message (%d bytes): %s", len(data), exc)
            return
        if partial is not None:
            self.hub.show(conversation, Partial(text, status) if text or status else CLEARED)
            return
        if isinstance(working, bool):
            self.hub.remote_working(conversation, working, turn)
        self.hub.notify(conversation)
