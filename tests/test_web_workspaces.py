"""The web chat with BUB_WORKSPACE_MAP: a conversation's tape is named after its workspace, so
the page, the conversation list, the event stream and the viewer's "context now" must find it
where the runtime keeps it, not in BUB_WORKSPACE."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes.openai_server import FakeOpenAI, text
from tests.test_web import TOKEN, Web, web

__all__ = ["web"]  # fixture


def write_map(tmp_path: Path, match: str, path: Path | str) -> Path:
    mapfile = tmp_path / "map.json"
    mapfile.write_text(json.dumps({"workspaces": [{"match": match, "path": str(path)}]}))
    return mapfile


async def kinds(w: Web, conversation: str) -> list[str]:
    status, data = await w.chat.get_json(f"/api/conversations/{conversation}/messages")
    assert status == 200
    return [i["kind"] for i in data["items"]]


async def listed(w: Web) -> list[str]:
    _, data = await w.chat.get_json("/api/conversations")
    return [c["id"] for c in data["conversations"]]


async def test_a_conversation_in_its_own_workspace_shows_everywhere(
    web, tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    """`web:*` -> a directory per conversation: the messages JSON, the event stream and the
    list read the tape the runtime wrote; looking at a new conversation creates nothing."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    w = await web(workspace_map=write_map(tmp_path, "web:*", scratch / "{tape}"))
    conversation = await w.chat.new_conversation()
    assert await kinds(w, conversation) == []
    assert list(scratch.iterdir()) == []  # only looked: no directory made for it yet
    fake_openai.script(text("the answer"))
    assert (await w.chat.post(conversation, "hello there"))[0] == 202
    await w.idle(conversation)
    assert len(list(scratch.iterdir())) == 1  # its own directory, made for its first message
    assert await kinds(w, conversation) == ["anchor", "user", "bot"]
    assert await listed(w) == [conversation]
    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "text/event-stream"}
    url = f"{w.url}/api/conversations/{conversation}/events"
    async with w.http.get(url, headers=headers) as resp:
        body = b""
        while b"event: sync" not in body or not body.endswith(b"\n\n"):
            body += await resp.content.readany()
    sync = json.loads(body.split(b"event: sync\ndata: ", 1)[1].split(b"\n", 1)[0])
    assert [i["kind"] for i in sync["items"]] == ["anchor", "user", "bot"]


async def test_context_now_is_built_in_the_sessions_workspace(
    web, tmp_path: Path, workspace: Path, fake_openai: FakeOpenAI
) -> None:
    """The viewer's system prompt has the session's AGENTS.md, as the model got it (secrets
    redacted), not BUB_WORKSPACE's."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "AGENTS.md").write_text("SCRATCH RULES; the key is sk-test-0123456789")
    (workspace / "AGENTS.md").write_text("DEFAULT RULES")
    w = await web(
        workspace_map=write_map(tmp_path, "web:*", scratch), openai_api_key="sk-test-0123456789"
    )
    conversation = await w.chat.new_conversation()
    fake_openai.script(text("ok"))
    await w.chat.post(conversation, "hello")
    await w.idle(conversation)
    sent = fake_openai.last_messages()
    name = (await w.bot.runtime.session_tape(f"web:{conversation}")).name
    _, ctx = await w.chat.get_json(f"/tapes/{name}/context")
    system = ctx["messages"][0]["content"]
    assert "SCRATCH RULES" in system and "DEFAULT RULES" not in system
    assert "sk-test-0123456789" not in system and "[redacted]" in system
    assert ctx["messages"] == [*sent, {"role": "assistant", "content": "ok"}]


async def test_a_conversation_from_before_the_map_stays_where_it_started(
    web, tmp_path: Path, workspace: Path, fake_openai: FakeOpenAI
) -> None:
    """A map added later applies to new conversations: an old one is still listed and shown
    (from BUB_WORKSPACE's tape) and goes on there; a new one goes to the mapped workspace."""
    (workspace / "AGENTS.md").write_text("DEFAULT RULES")
    before = await web()
    old = await before.chat.new_conversation()
    fake_openai.script(text("first answer"))
    await before.chat.post(old, "first")
    await before.idle(old)
    await before.server.stop()

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "AGENTS.md").write_text("SCRATCH RULES")
    w = await web(workspace_map=write_map(tmp_path, "web:*", scratch))
    assert await listed(w) == [old]
    assert await kinds(w, old) == ["anchor", "user", "bot"]
    fake_openai.script(text("second answer"), text("new answer"))
    await w.chat.post(old, "second")
    await w.idle(old)
    assert "DEFAULT RULES" in fake_openai.last_messages()[0]["content"]
    assert await kinds(w, old) == ["anchor", "user", "bot", "user", "bot"]
    new = await w.chat.new_conversation()
    await w.chat.post(new, "hello")
    await w.idle(new)
    assert "SCRATCH RULES" in fake_openai.last_messages()[0]["content"]
    assert sorted(await listed(w)) == sorted([old, new])
    assert await kinds(w, new) == ["anchor", "user", "bot"]
