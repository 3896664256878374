"""What the schedule tests share: a clock the test moves, and reading a job's firings back."""

from __future__ import annotations

import json
import time
from typing import Any

from bub_bot.tape import Tape, TapeEntry
from tests.fakes.openai_server import FakeOpenAI, tool_calls


class Clock:
    """UNIX seconds that move only when the test says (`advance`, `at`)."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def add_call(**arguments: Any) -> Any:
    """The model's reply that calls schedule.add with `arguments`."""
    return tool_calls([("schedule_add", arguments)])


def tool_results(fake: FakeOpenAI) -> list[str]:
    """Every tool result the model was shown, in order (the last request holds them all)."""
    found: list[str] = []
    for request in fake.completion_requests():
        for message in request.body["messages"]:
            if message["role"] == "tool" and message["content"] not in found:
                found.append(message["content"])
    return found


def last_result(fake: FakeOpenAI) -> Any:
    """The newest tool result, parsed when it is JSON."""
    content = tool_results(fake)[-1]
    try:
        return json.loads(content)
    except ValueError:
        return content


async def scheduled(tape: Tape) -> list[TapeEntry]:
    """The scheduled messages a tape got (user messages a job made)."""
    found = await tape.query(kinds=["message"], names=["user"])
    return [e for e in found if e.meta.get("origin") == "schedule" and "copy_of" not in e.meta]
