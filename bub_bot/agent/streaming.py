"""A streamed chat completion: server-sent events in, one `ModelReply`'s parts out.

The model client asks for `stream: true` when someone watches the step (the runtime, to show
the answer while it is written). This module reads the event stream itself (no SDK object per
chunk) and assembles what a non-streamed answer would have held: the text, the tool calls
(ids, names and argument fragments arrive by `index`), usage and the finish reason.

What is reported while the text grows (`Progress`) has already passed the secret scrubber:
a secret can be split across deltas, so the tail that could be the start of a secret is held
back until the next delta shows it is not (`ScrubbedText`), and the final text is scrubbed
whole, as a non-streamed answer is. Tool names shown while a step runs are scrubbed too.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..secrets import Scrubber

log = logging.getLogger(__name__)

_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Progress:
    """What one model step has produced so far, for showing it while it is written.

    `text`: the answer text of the step so far (scrubbed, cut at a safe point).
    `tools`: the step calls these tools (the text of such a step is not the answer).
    `thinking`: the model is reasoning (nothing to show; the working indicator stays).
    `reset`: what was shown for this step is void (a fallback request answers it again).
    """

    kind: Literal["text", "tools", "thinking", "reset"]
    text: str = ""
    tools: tuple[str, ...] = ()


ProgressCallback = Callable[[Progress], None]
"""Called synchronously for every change; must be cheap (it runs once per delta)."""


def tell(callback: ProgressCallback, progress: Progress) -> None:
    """Report progress; a watcher's failure never breaks the step (it is logged)."""
    try:
        callback(progress)
    except Exception:
        log.exception("progress watcher failed")


class Watch:
    """The step's progress callback, remembering whether something shown waits to be
    taken back (a step that falls back to a plain request, or is cut off by its deadline,
    then says `reset`)."""

    __slots__ = ("callback", "shown")

    def __init__(self, callback: ProgressCallback) -> None:
        self.callback = callback
        self.shown = False

    def __call__(self, progress: Progress) -> None:
        self.shown = progress.kind != "reset"
        self.callback(progress)

    def take_back(self) -> None:
        """Take back what was shown, once: nothing when nothing waits to be taken back (so
        two paths of one step that both end it never take it back twice), and a watcher's
        failure does not hide the step's answer or error."""
        if self.shown:
            tell(self, Progress("reset"))


class StreamBroken(Exception):
    """The stream ended without a finish, or sent something that is no chunk: the step falls
    back to a non-streamed request."""


class StreamErrorEvent(Exception):
    """An error event inside the stream; `error` is its error object."""

    def __init__(self, error: Any) -> None:
        message = error.get("message") if isinstance(error, dict) else error
        super().__init__(message if isinstance(message, str) else json.dumps(message))
        self.error = error


class ScrubbedText:
    """The text of a stream as it grows, with configured secrets replaced.

    The scrubber goes through a text from left to right and at each position replaces the
    longest secret that starts there. While the text grows, that choice is still open at a
    position where the rest of the text so far is the beginning of a secret (the next delta
    may complete it): the text from the first such position the scrubber would reach is held
    back, everything before it is scrubbed and final. So what `text` shows is always the
    beginning of the scrubbed whole, and it never ends in the beginning of a secret that could
    still be completed. `finish()` scrubs the whole text at once, exactly as a non-streamed
    answer is scrubbed.
    """

    __slots__ = ("_firsts", "_longest", "_parts", "_pattern", "_pending", "_scrub", "text")

    def __init__(self, scrub: Scrubber) -> None:
        self._scrub = scrub
        self._parts: list[str] = []
        self._pending = ""
        """The raw text from the first position whose scrubbing is not decided yet."""
        self.text = ""
        self._longest = scrub.longest
        self._firsts = frozenset(s[0] for s in scrub.secrets)
        # The scrubber's own pattern: where its matches lie tells which positions its
        # left-to-right pass reaches.
        self._pattern = scrub.pattern

    @property
    def held(self) -> int:
        """How many characters of raw text wait for the next delta."""
        return len(self._pending)

    def add(self, delta: str) -> bool:
        """Append a delta; True when `text` changed."""
        if not delta:
            return False
        self._parts.append(delta)
        if self._pattern is None:
            self.text += delta
            return True
        pending = self._pending + delta
        cut = self._decided(pending)
        self._pending = pending[cut:]
        if cut:
            self.text += self._scrub.text(pending[:cut])
        return cut > 0

    def finish(self) -> str:
        """The whole text, scrubbed as one (the held-back tail included)."""
        whole = "".join(self._parts)
        self._parts = [whole]
        self._pending = ""
        self.text = self._scrub.text(whole)
        return self.text

    def _decided(self, text: str) -> int:
        """How much of `text` (which starts where the scrubber's pass stands) is scrubbed
        the same whatever follows: up to the first position the pass reaches where the rest
        is a proper beginning of a secret."""
        n = len(text)
        waiting = [
            q
            for q in range(max(0, n - self._longest + 1), n)
            if text[q] in self._firsts
            and any(len(s) > n - q and s.startswith(text[q:]) for s in self._scrub.secrets)
        ]
        if not waiting:
            return n
        assert self._pattern is not None
        # A position inside a secret found before it is never reached: the pass replaces
        # that secret whole and goes on after it.
        found = [(m.start(), m.end()) for m in self._pattern.finditer(text)]
        for q in waiting:
            if not any(start < q < end for start, end in found):
                return q
        return n


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class Assembled:
    """The parts of a streamed completion, as a non-streamed answer would carry them."""

    content: str
    tool_calls: list[dict[str, Any]]
    usage: Any
    model: Any
    finish_reason: str | None


class Assembler:
    """Collects the chunks of one streamed completion and reports progress."""

    def __init__(self, scrub: Scrubber, on_progress: ProgressCallback) -> None:
        self._scrub = scrub
        self.text = ScrubbedText(scrub)
        self.on_progress = on_progress
        self.calls: dict[int, _Call] = {}
        self.usage: Any = None
        self.model: Any = None
        self.finish_reason: str | None = None
        self.chunks = 0
        self._thinking = False
        self._high = ""
        """A high surrogate half that waits for its low half in the next delta."""

    def add(self, chunk: Any) -> None:
        """One parsed `data:` payload; raises StreamBroken / StreamErrorEvent."""
        if not isinstance(chunk, dict):
            raise StreamBroken(f"a chunk that is a {type(chunk).__name__}")
        if chunk.get("error") and not chunk.get("choices"):
            raise StreamErrorEvent(chunk["error"])
        self.chunks += 1
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.model = chunk["model"]
        choices = chunk.get("choices")
        if not choices:
            return  # the usage chunk (or a keep-alive)
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise StreamBroken("choices that are not a list of objects")
        choice = choices[0]
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            self.finish_reason = finish
        delta = choice.get("delta")
        if delta is None:
            return
        if not isinstance(delta, dict):
            raise StreamBroken("a delta that is not an object")
        content = delta.get("content")
        if isinstance(content, list):  # content parts, as some servers send them
            content = "".join(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
        if isinstance(content, str) and content:
            if self.text.add(self._paired(content)) and not self.calls:
                self._report(Progress("text", self.text.text))
        elif not self._thinking and not self.text.text and _reasoning(delta):
            self._thinking = True
            self._report(Progress("thinking"))
        calls = delta.get("tool_calls")
        if calls:
            self._add_calls(calls)

    def _paired(self, content: str) -> str:
        """`content` with the halves of a surrogate pair split across two JSON strings joined
        (a trailing high half waits for its partner), so the scrubber and the watcher see the
        text a non-streamed answer would hold."""
        if not self._high and not _SURROGATE.search(content):
            return content
        content, self._high = self._high + content, ""
        if "\ud800" <= content[-1] <= "\udbff":
            content, self._high = content[:-1], content[-1]
        return _join_surrogates(content)

    def _add_calls(self, calls: Any) -> None:
        if not isinstance(calls, list):
            raise StreamBroken("tool_calls that are not a list")
        named = len([c for c in self.calls.values() if c.name])
        for raw in calls:
            if not isinstance(raw, dict):
                raise StreamBroken("a tool call delta that is not an object")
            index = raw.get("index")
            if not isinstance(index, int) or isinstance(index, bool):
                # No index: a new call when it has an id we have not seen, else the last one.
                known = {c.id: i for i, c in self.calls.items()}
                index = known.get(raw.get("id") or "", None)
                if index is None:
                    index = len(self.calls) if raw.get("id") or not self.calls else max(self.calls)
            call = self.calls.setdefault(index, _Call())
            if isinstance(raw.get("id"), str) and raw["id"] and not call.id:
                call.id = raw["id"]
            function = raw.get("function") or {}
            if not isinstance(function, dict):
                raise StreamBroken("a tool call function that is not an object")
            name = function.get("name")
            if isinstance(name, str) and name and name != call.name:
                # Some servers repeat the whole name in every delta, others send it once.
                call.name = name if not call.name else call.name + name
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                call.arguments.append(arguments)
            elif arguments is not None:
                call.arguments.append(json.dumps(arguments))
        if len([c for c in self.calls.values() if c.name]) > named:
            # Shown in the status ("using fetch…"): scrubbed like the answer text.
            names = tuple(self._scrub.text(c.name) for _, c in sorted(self.calls.items()) if c.name)
            self._report(Progress("tools", tools=names))

    def _report(self, progress: Progress) -> None:
        tell(self.on_progress, progress)

    def result(self) -> Assembled:
        """The completion's parts; raises StreamBroken when the stream never finished."""
        if self.finish_reason is None:
            raise StreamBroken(f"the stream ended after {self.chunks} chunks without a finish")
        if self._high:
            self.text.add(_join_surrogates(self._high))  # never got its partner
            self._high = ""
        content = self.text.finish()
        calls = [
            {
                "id": c.id or None,
                "type": "function",
                "function": {"name": c.name, "arguments": "".join(c.arguments)},
            }
            for _, c in sorted(self.calls.items())
        ]
        return Assembled(content, calls, self.usage, self.model, self.finish_reason)


def _join_surrogates(text: str) -> str:
    """A surrogate pair split across two JSON strings arrives as two lone halves: join them
    (a half without its partner becomes U+FFFD, which the tape can store)."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _reasoning(delta: dict[str, Any]) -> bool:
    for key in ("reasoning_content", "reasoning"):
        value = delta.get(key)
        if isinstance(value, str) and value:
            return True
    return False


async def events(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[str, str]]:
    """Server-sent events as (event name, data) from a byte stream; stops at `[DONE]`."""
    buffer = b""
    event = ""
    data: list[str] = []
    async for block in chunks:
        buffer += block
        while True:
            cut = buffer.find(b"\n")
            if cut < 0:
                break
            line = buffer[:cut].rstrip(b"\r").decode("utf-8", "replace")
            buffer = buffer[cut + 1 :]
            if not line:
                if data:
                    payload = "\n".join(data)
                    if payload.strip() == "[DONE]":
                        return
                    yield event, payload
                event, data = "", []
                continue
            if line.startswith(":"):
                continue  # a comment (keep-alive)
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value
    if data:
        payload = "\n".join(data)
        if payload.strip() != "[DONE]":
            yield event, payload
