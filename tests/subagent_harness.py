"""What the background subagent tests share: a fake model that plays parent and child."""

from __future__ import annotations

from typing import Any

from tests.fakes.openai_server import slow, text, tool_calls

CHILD_PROMPT = "dig into it"


def content_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


class Router:
    """Replies by what a request holds: the parent's first step asks for a background
    subagent, its next answers "started it"; the child answers (slowly `child_delays` times
    first); a background result is relayed as "relay: <first line of the result>"."""

    def __init__(self, *, child_delays: tuple[float, ...] = (), fail_child: bool = False) -> None:
        self.delays = list(child_delays)
        self.fail_child = fail_child
        self.child_calls = 0
        self.relayed: list[str] = []

    def __call__(self, body: dict[str, Any]) -> Any:
        messages = body.get("messages", [])
        users = [content_of(m) for m in messages if m.get("role") == "user"]
        last = users[-1] if users else ""
        if last.startswith("[Background subagent"):
            self.relayed.append(last)
            return text("relay: " + last.split("]\n", 1)[1].split("\n", 1)[0])
        if last == CHILD_PROMPT:
            self.child_calls += 1
            if self.fail_child:
                from tests.fakes.openai_server import server_error

                return server_error(500)
            reply = text("child found 42")
            return slow(reply, self.delays.pop(0)) if self.delays else reply
        if messages and messages[-1].get("role") == "tool":
            return text("started it")
        return tool_calls([("subagent", {"prompt": CHILD_PROMPT, "background": True})])
