"""The web relay's working state and partials across replicas, at the unit level (found in
review): a late "turn ended" from a replica that lost the session, a remote turn whose end was
never heard, and a throttled partial that must arrive late rather than never."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from channels.web.hub import Hub
from channels.web.relay import Relay
from channels.web.stream import RELAY_INTERVAL, WebStream


class Recorder:
    """A runtime's broadcasts, recorded (what the other replicas would hear)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def broadcast(self, topic: str, data: str) -> None:
        self.sent.append(json.loads(data))

    def subscribe(self, topic: str, callback: Any) -> None:
        pass


def test_a_late_end_of_another_turn_does_not_clear_the_running_one() -> None:
    hub = Hub()
    relay = Relay(hub)
    relay.heard(json.dumps({"c": "conv-123", "w": True, "t": "turn-b"}))  # B starts
    relay.heard(json.dumps({"c": "conv-123", "w": True, "t": "turn-c"}))  # C took over
    relay.heard(json.dumps({"c": "conv-123", "p": ["C writes", ""]}))
    relay.heard(json.dumps({"c": "conv-123", "w": False, "t": "turn-b"}))  # B's late end
    assert hub.busy("conv-123")
    assert hub.partial("conv-123") is not None
    relay.heard(json.dumps({"c": "conv-123", "w": False, "t": "turn-c"}))
    assert not hub.busy("conv-123") and hub.partial("conv-123") is None


async def test_a_turn_here_ends_a_remote_turn_that_never_said_so() -> None:
    hub = Hub()
    Relay(hub).heard(json.dumps({"c": "conv-123", "w": True, "t": "turn-dead"}))
    assert hub.busy("conv-123")
    async with hub.working("conv-123"):  # this replica took the session over
        assert hub.busy("conv-123")
    assert not hub.busy("conv-123")


async def test_a_throttled_partial_reaches_the_other_replicas_late_not_never() -> None:
    runtime = Recorder()
    relay = Relay(Hub())
    relay.start(runtime)  # type: ignore[arg-type]
    local = Hub()
    async with local.working("conv-123"):
        stream = WebStream(local, "conv-123", relay)
        await stream.update("Let me look at the file.")
        await stream.reset()
        await stream.status("using fs.read…")
        await stream.update("The file says 42, so")  # within the interval: held
        assert runtime.sent[-1]["p"] == ["", "using fs.read…"]
        await asyncio.sleep(RELAY_INTERVAL + 0.2)
        assert runtime.sent[-1]["p"] == ["The file says 42, so", ""]
        await stream.end(1)
