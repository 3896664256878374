"""Chat commands through the runtime: replies, usage lines, anchors, archives, summaries."""

from __future__ import annotations

import pytest

from bub_bot import commands
from bub_bot.runtime import SUMMARY_PROMPT
from bub_bot.tape import Tape
from tests.fakes.openai_server import server_error, slow, text, tool_calls
from tests.runtime_channel import (
    events,
    idle,
    inbound_users,
    make_runtime,
    tape_of,
    until,
    user_texts,
)

__all__ = ["make_runtime"]  # the fixture

SUMMARY_PREFIX = "[Summary of the previous phase]\n"


def model_input(body: dict) -> list[dict]:
    """The messages of a request without the system prompt."""
    return [m for m in body["messages"] if m["role"] != "system"]


def summaries_in(body: dict) -> int:
    return sum(
        1
        for m in body["messages"]
        if isinstance(m.get("content"), str) and m["content"].startswith(SUMMARY_PREFIX)
    )


async def anchor_names(tape: Tape) -> list[str]:
    return [a.payload["name"] for a in await tape.query(kinds=["anchor"])]


async def talk(runtime, channel, *texts: str, chat: str = "a") -> list[str]:
    """Send messages one after another (each after the previous is handled); new replies."""
    before = len(channel.texts(chat))
    for line in texts:
        await channel.say(line, chat)
        await idle(runtime, f"test:{chat}")
    return channel.texts(chat)[before:]


# -- parsing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "names", "expected"),
    [
        ("/status", (), ("status", "", None)),
        ("  /STATUS", (), ("status", "", None)),
        ("/status@bub_bot", ("@bub_bot",), ("status", "", None)),
        ("/status@other_bot", ("@bub_bot",), None),
        ("@bub_bot /status", ("@bub_bot",), ("status", "", None)),
        ("<@U123>: /reset", ("<@U123>",), ("reset", "", None)),
        ("/handoff", (), ("handoff", "", None)),
        ("/handoff moving on", (), ("handoff", "moving on", None)),
        ("/handoff\nline one\nline two", (), ("handoff", "line one\nline two", None)),
        ("/weather in Paris", (), None),
        ("please /status", (), None),
        ("/status now", (), "usage"),
        ("/reset all", (), "usage"),
        ("/help me", (), "usage"),
        ("/anchors 5", (), ("anchors", "5", None)),
        ("/anchors 0", (), "usage"),
        ("/anchors 101", (), "usage"),
        ("/anchors abc", (), "usage"),
        ("/handoff name=bad! text", (), "usage"),
        ("/handoff name= text", (), "usage"),
        ("/handoff name=phase-2\n summary", (), "usage"),  # no newline in an anchor name
    ],
)
def test_parse(line: str, names: tuple[str, ...], expected) -> None:
    parsed = commands.parse(line, names)
    if expected is None:
        assert parsed is None
    elif expected == "usage":
        assert parsed is not None and parsed.error and "Usage: /" in parsed.error
    else:
        assert parsed is not None
        assert (parsed.name, parsed.args, parsed.error) == expected


def test_parse_handoff_anchor_name() -> None:
    parsed = commands.parse("/handoff name=phase-2/api done with the API")
    assert parsed is not None
    assert (parsed.anchor_name, parsed.args, parsed.error) == (
        "phase-2/api",
        "done with the API",
        None,
    )
    assert commands.parse("/handoff x").anchor_name == "handoff"  # type: ignore[union-attr]


# -- every command through the runtime ----------------------------------------------------------


async def test_help_status_anchors(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime()
    usage = {"prompt_tokens": 321, "completion_tokens": 7, "total_tokens": 328}
    fake_openai.script(text("hello back", usage=usage))
    replies = await talk(runtime, channel, "hello", "/help", "/status", "/anchors")
    assert replies[0] == "hello back"
    assert replies[1] == commands.help_text()
    for name in ("/handoff", "/reset", "/status", "/anchors", "/help"):
        assert name in replies[1]
    status = replies[2].splitlines()
    assert status[0].startswith("Entries: ")
    assert status[1:4] == ["Anchors: 1", "Last anchor: session/start", status[3]]
    assert status[3].startswith("Entries since it: ")
    assert status[4] == "Last token usage: 321 in, 7 out"
    assert replies[3].startswith("Anchors (oldest first):\n#1 session/start (")
    # commands are events, never model messages
    tape = tape_of(runtime, "test:a")
    assert [c.payload["data"]["name"] for c in await events(tape, "command")] == [
        "help",
        "status",
        "anchors",
    ]
    assert [e.payload["content"] for e in await inbound_users(tape)] == ["hello"]
    assert len(fake_openai.completion_requests()) == 1
    # the next turn does not see them either
    await talk(runtime, channel, "again")
    assert user_texts(fake_openai.completion_requests()[-1].body) == ["hello", "again"]


@pytest.mark.parametrize(
    "line",
    [
        "/reset extra",
        "/status please",
        "/help me",
        "/anchors abc",
        "/anchors 0",
        "/handoff name=bad! x",
    ],
)
async def test_bad_arguments_get_a_usage_line_and_change_nothing(
    make_runtime, fake_openai, line: str
) -> None:
    runtime, channel = make_runtime()
    await talk(runtime, channel, "hello")
    tape = tape_of(runtime, "test:a")
    anchors_before = await anchor_names(tape)
    name = line.split()[0].lstrip("/")
    [reply] = await talk(runtime, channel, line)
    assert "Usage: /" + name in reply
    assert reply.count("\n") == 0
    assert await anchor_names(tape) == anchors_before
    assert len(fake_openai.completion_requests()) == 1
    [done] = await events(tape, "command.done")
    assert done.payload["data"]["ok"] is False
    # the conversation goes on as before
    await talk(runtime, channel, "next")
    assert user_texts(fake_openai.completion_requests()[-1].body) == ["hello", "next"]


async def test_unknown_slash_word_goes_to_the_model(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime()
    assert await talk(runtime, channel, "/weather in Paris") == ["echo: /weather in Paris"]
    assert user_texts(fake_openai.completion_requests()[0].body) == ["/weather in Paris"]
    assert await events(tape_of(runtime, "test:a"), "command") == []


async def test_commands_addressed_to_the_bot(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime()
    names = ("@bub_bot",)
    await channel.say("@bub_bot /status", bot_names=names)
    await idle(runtime, "test:a")
    await channel.say("/status@bub_bot", bot_names=names)
    await idle(runtime, "test:a")
    await channel.say("/status@other_bot", bot_names=names)  # another bot's: text for the model
    await idle(runtime, "test:a")
    replies = channel.texts("a")
    assert replies[0].startswith("Entries: "), replies[0]
    assert replies[1].startswith("Entries: "), replies[1]
    assert replies[2] == "echo: /status@other_bot"
    assert len(fake_openai.completion_requests()) == 1


# -- /handoff ------------------------------------------------------------------------------------


async def test_handoff_with_text_and_name(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime()
    await talk(runtime, channel, "we picked postgres")
    [reply] = await talk(runtime, channel, "/handoff name=phase-2 DB chosen: postgres")
    assert reply.startswith("Handed off (phase-2).")
    assert "DB chosen: postgres" in reply
    tape = tape_of(runtime, "test:a")
    anchors = await tape.query(kinds=["anchor"])
    assert anchors[-1].payload == {
        "name": "phase-2",
        "state": {"owner": "human", "summary": "DB chosen: postgres"},
    }
    assert len(fake_openai.completion_requests()) == 1  # no summary call
    await talk(runtime, channel, "next step?", "and then?")
    first_after, second_after = (r.body for r in fake_openai.completion_requests()[1:])
    assert model_input(first_after) == [
        {"role": "user", "content": SUMMARY_PREFIX + "DB chosen: postgres"},
        {"role": "user", "content": "next step?"},
    ]
    assert summaries_in(first_after) == 1
    assert summaries_in(second_after) == 1
    # a plain /handoff <text> uses the default anchor name
    await talk(runtime, channel, "/handoff short")
    assert (await anchor_names(tape))[-1] == "handoff"


async def test_handoff_asks_the_model_for_a_summary(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime()
    await talk(runtime, channel, "we picked postgres")
    fake_openai.script(text("- DB: postgres\n- next: schema"))
    [reply] = await talk(runtime, channel, "/handoff")
    assert reply.startswith("Handed off (handoff). Summary carried into the next phase:")
    assert reply.endswith("- DB: postgres\n- next: schema")
    summary_request = fake_openai.completion_requests()[1].body
    assert summary_request["messages"][-1] == {"role": "user", "content": SUMMARY_PROMPT}
    assert "we picked postgres" in user_texts(summary_request)
    tape = tape_of(runtime, "test:a")
    anchor = (await tape.query(kinds=["anchor"]))[-1]
    assert anchor.payload["state"] == {
        "owner": "human",
        "summary": "- DB: postgres\n- next: schema",
    }

    await talk(runtime, channel, "what now?")
    body = fake_openai.completion_requests()[-1].body
    assert model_input(body) == [
        {"role": "user", "content": SUMMARY_PREFIX + "- DB: postgres\n- next: schema"},
        {"role": "user", "content": "what now?"},
    ]
    assert len(fake_openai.completion_requests()) == 3


@pytest.mark.parametrize("failure", ["error", "timeout"])
async def test_handoff_without_summary_when_the_model_fails(
    make_runtime, fake_openai, failure: str
) -> None:
    runtime, channel = make_runtime(handoff_summary_timeout_seconds=0.3)
    await talk(runtime, channel, "hello")
    fake_openai.script(server_error(500) if failure == "error" else slow(text("late"), 3))
    [reply] = await talk(runtime, channel, "/handoff")
    assert reply.startswith("Handed off (handoff).")
    assert "could not write a summary" in reply
    tape = tape_of(runtime, "test:a")
    anchor = (await tape.query(kinds=["anchor"]))[-1]
    assert anchor.payload == {"name": "handoff", "state": {"owner": "human"}}
    await talk(runtime, channel, "fresh start")
    assert model_input(fake_openai.completion_requests()[-1].body) == [
        {"role": "user", "content": "fresh start"}
    ]


async def test_message_queued_behind_handoff_reaches_the_next_phase(
    make_runtime, fake_openai
) -> None:
    """A message sent after `/handoff` while a turn ran is answered in the new phase."""
    runtime, channel = make_runtime()
    fake_openai.script(slow(text("first answer"), 0.4))
    await channel.say("first")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await channel.say("/handoff the summary")
    await channel.say("queued question")
    await idle(runtime, "test:a")
    replies = channel.texts("a")
    assert replies[0] == "first answer"
    assert replies[1].startswith("Handed off (handoff).")
    assert replies[2] == "echo: queued question"
    assert model_input(fake_openai.completion_requests()[-1].body) == [
        {"role": "user", "content": SUMMARY_PREFIX + "the summary"},
        {"role": "user", "content": "queued question"},
    ]


# -- /reset --------------------------------------------------------------------------------------


async def test_reset_archives_and_starts_empty(make_runtime, fake_openai, store) -> None:
    runtime, channel = make_runtime()
    fake_openai.script(tool_calls([("tape_info", {})]), text("noted"))
    await talk(runtime, channel, "remember 42")
    tape = tape_of(runtime, "test:a")
    entries_before = (await tape.info()).entries
    [reply] = await talk(runtime, channel, "/reset")
    prefix = "Started a fresh conversation. The previous one is archived as "
    assert reply.startswith(prefix)
    archive = reply[len(prefix) :].rstrip(".")
    # the archive is a tape of its own with everything on it, and not a live tape
    archived = await store.query(archive)
    assert len(archived) >= entries_before
    assert "remember 42" in [e.payload.get("content") for e in archived if e.kind == "message"]
    assert archive in {t.name for t in await store.list_tapes(include_all=True)}
    assert archive not in {t.name for t in await store.list_tapes()}
    # the live tape starts over with an anchor naming the archive
    first = (await tape.query(kinds=["anchor"]))[0]
    assert first.id == 1
    assert first.payload == {
        "name": "session/start",
        "state": {
            "owner": "human",
            "archived": archive,
            "workspace": str(runtime.settings.workspace),
        },
    }
    assert await tape.read_messages() == []
    await talk(runtime, channel, "what did I say?")
    assert model_input(fake_openai.completion_requests()[-1].body) == [
        {"role": "user", "content": "what did I say?"}
    ]
    # a restart finds nothing to redo
    assert await runtime.resume() == 0
