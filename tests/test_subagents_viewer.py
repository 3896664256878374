"""The tape viewer shows a session's subagent tapes and forks under it, links back from
them, and lists fork.merge / sidecar.* events."""

from __future__ import annotations

from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.test_web import web

__all__ = ["web"]  # fixture, used by name


async def test_viewer_links_parent_and_subagent_tapes(web, fake_openai: FakeOpenAI) -> None:
    w = await web()
    conversation = await w.chat.new_conversation()
    fake_openai.script(
        tool_calls(
            [
                ("subagent", {"prompt": "one-off job"}),
                ("subagent", {"prompt": "keep notes", "session": "notes"}),
            ]
        ),
        text("child answer"),
        text("child answer"),
        text("both done"),
    )
    await w.chat.post(conversation, "use helpers")
    await w.idle(conversation)
    session = f"web:{conversation}"
    _, listing = await w.chat.get_json("/tapes")
    [row] = [t for t in listing["tapes"] if t["session_id"] == session]
    _, view = await w.chat.get_json(f"/tapes/{row['name']}")
    kinds = sorted(c["kind"] for c in view["children"])
    assert kinds == ["named subagent", "temp subagent (archived)"]
    named = next(c for c in view["children"] if c["kind"] == "named subagent")
    assert named["session_id"] == f"{session}/agents/notes"
    _, child = await w.chat.get_json(f"/tapes/{named['name']}?view=all")
    assert child["parent"]["name"] == row["name"] and child["parent"]["kind"] == "subagent of"
    assert "fork.merge" in [e["payload"].get("name") for e in child["entries"]]
    async with w.http.get(f"{w.url}/tapes/{row['name']}", headers=w.chat.headers) as resp:
        page = await resp.text()
    assert "Subagents and forks" in page and f"/tapes/{named['name']}" in page
