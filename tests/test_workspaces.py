"""A workspace per conversation (BUB_WORKSPACE_MAP): rules, per-thread directories, each
conversation confined to its own files and AGENTS.md, decided once per session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bub_bot.config import ConfigError
from bub_bot.runtime import Runtime
from bub_bot.tape import Tape
from bub_bot.workspaces import load_workspace_map, safe_name
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.fakes.slack_api import FakeSlack, app_mention
from tests.runtime_channel import RuntimeChannel, idle
from tests.test_slack import StartBot, sid, slack, start_bot

__all__ = ["slack", "start_bot"]  # fixtures


def write_map(tmp_path: Path, *rules: tuple[str, str]) -> Path:
    path = tmp_path / f"map-{len(list(tmp_path.glob('map-*')))}.json"
    path.write_text(json.dumps({"workspaces": [{"match": m, "path": p} for m, p in rules]}))
    return path


def workspace(root: Path, name: str, marker: str, files: dict[str, str]) -> Path:
    path = root / name
    path.mkdir()
    (path / "AGENTS.md").write_text(marker)
    for file, content in files.items():
        (path / file).write_text(content)
    return path


def system_prompt(request: Any) -> str:
    return request.body["messages"][0]["content"]


def tool_results(request: Any) -> list[str]:
    return [m["content"] for m in request.body["messages"] if m["role"] == "tool"]


# -- the map file ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not valid JSON"),
        ('{"rules": []}', '{"workspaces": [...]}'),
        ('{"workspaces": {}}', "must be a list"),
        ('{"workspaces": [{"match": "x:*"}]}', '"match": "<glob>"'),
        ('{"workspaces": [{"match": "", "path": "/tmp"}]}', "non-empty glob"),
        ('{"workspaces": [{"match": "x:*", "path": "relative/dir"}]}', "absolute directory"),
        ('{"workspaces": [{"match": "x:*", "path": "/tmp/{user}"}]}', "unknown placeholder {user}"),
        ('{"workspaces": [{"match": "x:*", "path": "/tmp/../etc"}]}', "'..'"),
    ],
)
def test_a_broken_map_names_the_file_and_the_problem(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "map.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_workspace_map(path, tmp_path)
    message = str(caught.value)
    assert message.startswith(f"BUB_WORKSPACE_MAP: {path}")
    assert problem in message


def test_a_rule_whose_directory_is_missing_fails_the_start(tmp_path: Path, settings) -> None:
    path = write_map(tmp_path, ("slack:*", "/tmp"), ("web:*", str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match=r"rule 2 \(match 'web:\*'\): directory .*missing"):
        settings(workspace_map=path).check(require_model=False)
    # a per-session template needs its fixed part to exist, not the per-session directory
    fine = write_map(tmp_path, ("web:*", str(tmp_path / "{session}")))
    assert load_workspace_map(fine, tmp_path).rules[0].per_session
    missing = write_map(tmp_path, ("web:*", str(tmp_path / "nope" / "{tape}")))
    with pytest.raises(ConfigError, match="does not exist"):
        load_workspace_map(missing, tmp_path)


def test_first_match_wins_and_names_are_safe(tmp_path: Path) -> None:
    backend = tmp_path / "backend"
    backend.mkdir()
    rules = write_map(
        tmp_path,
        ("slack:T1:C1:*", str(backend)),
        ("slack:*", str(tmp_path / "{session}")),
    )
    found = load_workspace_map(rules, Path("/default"))
    assert found.resolve("slack:T1:C1:171.1") == backend
    assert found.resolve("telegram:5") == Path("/default")
    thread = found.resolve("slack:T1:C2:../../etc")
    assert thread.parent == tmp_path and thread.is_dir()
    assert ".." not in thread.name and "/" not in thread.name
    assert safe_name("a:b") != safe_name("a_b")


# -- conversations --------------------------------------------------------------------------------


async def test_two_slack_channels_see_their_own_workspace_only(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    alpha = workspace(tmp_path, "alpha", "ALPHA-TEAM rules", {"alpha.txt": "alpha data"})
    bravo = workspace(tmp_path, "bravo", "BRAVO-TEAM rules", {"bravo.txt": "bravo data"})
    rules = write_map(tmp_path, ("slack:T1:C1:*", str(alpha)), ("slack:T1:C2:*", str(bravo)))
    bot = await start_bot(workspace_map=rules)

    fake_openai.script(
        tool_calls([("fs_list", {}), ("fs_read", {"path": str(bravo / "bravo.txt")})]),
        text("done in C1"),
    )
    ts = slack.next_ts()
    await bot.post(app_mention("C1", "U1", "what is here?", ts))
    await bot.idle(sid("C1", ts))
    first, second = fake_openai.completion_requests()[-2:]
    assert "ALPHA-TEAM" in system_prompt(first) and "BRAVO-TEAM" not in system_prompt(first)
    listing, refused = tool_results(second)
    assert "alpha.txt" in listing and "bravo.txt" not in listing
    assert "bravo data" not in refused and "error" in refused.lower()

    fake_openai.script(tool_calls([("fs_read", {"path": "bravo.txt"})]), text("done in C2"))
    ts2 = slack.next_ts()
    await bot.post(app_mention("C2", "U1", "and here?", ts2))
    await bot.idle(sid("C2", ts2))
    first, second = fake_openai.completion_requests()[-2:]
    assert "BRAVO-TEAM" in system_prompt(first) and "ALPHA-TEAM" not in system_prompt(first)
    assert "bravo data" in tool_results(second)[0]
    # /status names the workspace of the conversation it is typed in
    await bot.post(app_mention("C2", "U1", "/status", slack.next_ts(), thread_ts=ts2))
    await bot.idle(sid("C2", ts2))
    assert f"Workspace: {bravo}" in slack.posts_in("C2", ts2)[-1]["text"]


async def test_a_session_rule_gives_each_thread_its_own_directory(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    rules = write_map(tmp_path, ("slack:*", str(scratch / "{session}")))
    bot = await start_bot(workspace_map=rules)
    first, second = slack.next_ts(), slack.next_ts()
    for ts in (first, second):
        await bot.post(app_mention("C1", "U1", "hi", ts))
        await bot.idle(sid("C1", ts))
    made = sorted(p.name for p in scratch.iterdir())
    assert made == sorted(safe_name(sid("C1", ts)) for ts in (first, second))


async def test_a_changed_map_applies_to_new_sessions_only(
    store, agent, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    old = workspace(tmp_path, "old", "OLD-PLACE", {})
    new = workspace(tmp_path, "new", "NEW-PLACE", {})

    async def talk(rules: Path, chat: str) -> str:
        built = agent(workspace_map=rules)
        channel = RuntimeChannel()
        runtime = Runtime(built.settings, store, built, {channel.name: channel})
        channel.runtime = runtime
        await channel.say("hello", chat, key=f"{chat}-{rules.name}")
        await idle(runtime, f"test:{chat}")
        await runtime.shutdown(grace=1)
        return channel.texts(chat)[-1]

    await talk(write_map(tmp_path, ("test:*", str(old))), "a")
    changed = write_map(tmp_path, ("test:*", str(new)))
    await talk(changed, "a")  # started in the old workspace: stays there
    assert "OLD-PLACE" in system_prompt(fake_openai.completion_requests()[-1])
    await talk(changed, "b")  # a new conversation follows the new map
    assert "NEW-PLACE" in system_prompt(fake_openai.completion_requests()[-1])
    tapes = {t.session_id: t.name for t in await store.list_tapes()}
    assert set(tapes) == {"test:a", "test:b"}
    assert await store.session_tapes("test:a") == [tapes["test:a"]]
    assert tapes["test:a"] == Tape.for_session(store, "test:a", old).name
    assert tapes["test:b"] == Tape.for_session(store, "test:b", new).name
