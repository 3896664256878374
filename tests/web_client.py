"""A small client of the web chat's HTTP API (tests and bench/web_bench.py): posting
messages and reading the conversation's Server-Sent Events."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class Event:
    """One Server-Sent Event."""

    event: str
    data: dict[str, Any]
    id: str | None
    at: float = field(default_factory=time.monotonic)
    """When it was read (`time.monotonic()`, the fake model's clock too)."""


class EventStream:
    """Reads the `text/event-stream` of a response one event at a time."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.last_id: str | None = None
        self.seen: list[Event] = []

    async def next(self, timeout: float = 10) -> Event:
        name, data, event_id = "message", [], None
        while True:
            raw = await asyncio.wait_for(self.response.content.readline(), timeout)
            if not raw:
                raise EOFError("the event stream ended")
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line:
                if data:
                    event = Event(name, json.loads("\n".join(data)), event_id)
                    if event_id is not None:
                        self.last_id = event_id
                    self.seen.append(event)
                    return event
                name, data, event_id = "message", [], None
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
            elif field == "id":
                event_id = value

    async def until(self, wanted: Callable[[Event], bool], timeout: float = 10) -> Event:
        """Read events until one matches (the ones before it stay in `seen`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event = await self.next(max(0.01, deadline - loop.time()))
            if wanted(event):
                return event

    async def close(self) -> None:
        self.response.close()


def items(events: list[Event], kind: str | None = None) -> list[dict[str, Any]]:
    """The chat items carried by `sync` and `entries` events, optionally of one kind."""
    found = []
    for event in events:
        if event.event in ("sync", "entries"):
            found += [i for i in event.data["items"] if kind is None or i["kind"] == kind]
    return found


def partials(events: list[Event]) -> list[Event]:
    """The `partial` events (the answer while it is written) among `events`."""
    return [e for e in events if e.event == "partial"]


def has_item(kind: str) -> Callable[[Event], bool]:
    return lambda e: (
        e.event in ("sync", "entries") and any(i["kind"] == kind for i in e.data["items"])
    )


class WebChat:
    """The chat API as the page uses it (bearer token instead of the page's cookie)."""

    def __init__(self, http: aiohttp.ClientSession, base_url: str, token: str) -> None:
        self.http = http
        self.base_url = base_url
        self.headers = {"Authorization": f"Bearer {token}"}

    async def new_conversation(self) -> str:
        async with self.http.post(
            f"{self.base_url}/api/conversations", json={}, headers=self.headers
        ) as resp:
            assert resp.status == 201, resp.status
            return (await resp.json())["id"]

    async def post(
        self, conversation: str, text: str, client_id: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        body = {"text": text, "client_id": client_id or uuid.uuid4().hex}
        async with self.http.post(
            f"{self.base_url}/api/conversations/{conversation}/messages",
            json=body,
            headers=self.headers,
        ) as resp:
            return resp.status, await resp.json()

    async def events(self, conversation: str, last_id: str | None = None) -> EventStream:
        headers = dict(self.headers)
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        resp = await self.http.get(
            f"{self.base_url}/api/conversations/{conversation}/events",
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        )
        assert resp.status == 200, resp.status
        return EventStream(resp)

    async def get_json(self, path: str) -> tuple[int, Any]:
        async with self.http.get(
            f"{self.base_url}{path}", headers={**self.headers, "Accept": "application/json"}
        ) as resp:
            return resp.status, await resp.json()
