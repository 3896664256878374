"""Context selection: tape entries -> OpenAI messages, through real SQLite and PostgreSQL
tapes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from bub_bot.tape import (
    Tape,
    TapeEntry,
    TapeStore,
    default_selector,
    visible,
)


@pytest.fixture
def tape(any_store: TapeStore) -> Tape:
    """A tape on each store kind (SQLite file, PostgreSQL database)."""
    return Tape(any_store, "t", session_id="test:ctx")


def user(text: str, **meta: Any) -> TapeEntry:
    return TapeEntry.message({"role": "user", "content": text}, **meta)


def assistant(text: str, **meta: Any) -> TapeEntry:
    return TapeEntry.message({"role": "assistant", "content": text}, **meta)


def call(call_id: str, name: str = "fs.read", **args: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def result(call_id: str, content: Any) -> dict[str, Any]:
    return {"tool_call_id": call_id, "content": content}


def tool_msg(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def parse_anchor(message: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Split `[Anchor created: <name>]: <state JSON>` into (name, state)."""
    assert message["role"] == "assistant"
    text = message["content"]
    assert text.startswith("[Anchor created: ")
    head, _, state = text.partition("]: ")
    return head.removeprefix("[Anchor created: "), json.loads(state)


async def test_messages_and_context_false(tape):
    await tape.append_many(
        [
            user("hello"),
            TapeEntry.message({"role": "user", "content": "typing…"}, context=False),
            assistant("hi there"),
            TapeEntry.event("spill.write", {"handle": "h"}, context=False),
            TapeEntry.message({"role": "user", "content": "kept"}, context=True),
        ]
    )
    assert await tape.read_messages() == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi there"},
        {"role": "user", "content": "kept"},
    ]
    entries = await tape.read_entries()
    assert [e.id for e in entries] == [1, 3, 5]


async def test_context_false_is_removed_before_a_custom_selector(tape):
    await tape.append_many([user("seen"), user("hidden", context=False)])
    seen: list[list[int]] = []

    def spy(entries: Sequence[TapeEntry]) -> list[dict[str, Any]]:
        seen.append([e.id for e in entries])
        return []

    await tape.read_messages(selector=spy)
    assert seen == [[1]]


async def test_tool_result_paired_by_id_with_parallel_calls(tape):
    await tape.append_many(
        [
            user("read two files"),
            TapeEntry.tool_call([call("c1", path="a"), call("c2", path="b")]),
            # Results land in one entry, in the other order, one structured.
            TapeEntry.tool_result([result("c2", {"lines": 2}), result("c1", "alpha")]),
            assistant("done"),
        ]
    )
    messages = await tape.read_messages()
    assert messages == [
        {"role": "user", "content": "read two files"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("c1", path="a"), call("c2", path="b")],
        },
        tool_msg("c2", json.dumps({"lines": 2})),
        tool_msg("c1", "alpha"),
        {"role": "assistant", "content": "done"},
    ]


async def test_results_in_separate_entries_pair_by_id_not_position(tape):
    await tape.append_many(
        [
            TapeEntry.tool_call([call("a1"), call("a2"), call("a3")]),
            TapeEntry.tool_result([result("a3", "three")]),
            TapeEntry.tool_result([result("a1", "one"), result("a2", ["two"])]),
        ]
    )
    messages = await tape.read_messages()
    assert [m["id"] for m in messages[0]["tool_calls"]] == ["a1", "a2", "a3"]
    assert messages[1:] == [
        tool_msg("a3", "three"),
        tool_msg("a1", "one"),
        tool_msg("a2", '["two"]'),
    ]


async def test_orphan_results_and_unanswered_calls_are_dropped(tape):
    await tape.append_many(
        [
            user("go"),
            # A result for a call that is not on the tape at all.
            TapeEntry.tool_result([result("ghost", "boo")]),
            # A call nobody answered (e.g. the process died mid-step): dropped entirely.
            TapeEntry.tool_call([call("lost")]),
            # Two calls, only one answered: the unanswered one is removed from the message.
            TapeEntry.tool_call([call("ok"), call("never")]),
            TapeEntry.tool_result([result("ok", "fine"), result("stray", "x")]),
            assistant("end"),
        ]
    )
    assert await tape.read_messages() == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call("ok")]},
        tool_msg("ok", "fine"),
        {"role": "assistant", "content": "end"},
    ]


async def test_result_whose_call_is_before_the_anchor_is_dropped(tape):
    await tape.append_many(
        [
            TapeEntry.tool_call([call("old")]),
            TapeEntry.anchor("phase"),
            TapeEntry.tool_result([result("old", "late result")]),
            user("next"),
        ]
    )
    assert await tape.read_messages() == [{"role": "user", "content": "next"}]


async def test_result_written_before_its_call_is_dropped(tape):
    await tape.append_many(
        [
            TapeEntry.tool_result([result("c", "too early")]),
            TapeEntry.tool_call([call("c")]),
            TapeEntry.tool_result([result("c", "on time")]),
        ]
    )
    messages = await tape.read_messages()
    assert messages == [
        {"role": "assistant", "content": "", "tool_calls": [call("c")]},
        tool_msg("c", "on time"),
    ]


async def test_events_system_and_errors_are_skipped(tape):
    await tape.append_many(
        [
            TapeEntry.event("run", {"usage": {"total_tokens": 5}}),
            TapeEntry.system("started"),
            user("question"),
            TapeEntry.error("model", "timeout"),
            TapeEntry.event("loop.step", {"status": "ok"}),
            assistant("answer"),
        ]
    )
    assert await tape.read_messages() == [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": "answer"},
    ]


async def test_assistant_text_before_tool_call_merges(tape):
    await tape.append_many(
        [
            user("check the file"),
            assistant("Let me look."),
            TapeEntry.event("loop.step"),  # skipped: the text is still directly before the call
            TapeEntry.tool_call([call("c1")]),
            TapeEntry.tool_result([result("c1", "contents")]),
            assistant("It says 'contents'."),
        ]
    )
    assert await tape.read_messages() == [
        {"role": "user", "content": "check the file"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [call("c1")]},
        tool_msg("c1", "contents"),
        {"role": "assistant", "content": "It says 'contents'."},
    ]


async def test_call_after_user_text_or_previous_call_is_its_own_message(tape):
    await tape.append_many(
        [
            user("do two steps"),
            TapeEntry.tool_call([call("s1")]),
            TapeEntry.tool_result([result("s1", "r1")]),
            TapeEntry.tool_call([call("s2")]),
            TapeEntry.tool_result([result("s2", "r2")]),
        ]
    )
    messages = await tape.read_messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert messages[1] == {"role": "assistant", "content": "", "tool_calls": [call("s1")]}
    assert messages[3] == {"role": "assistant", "content": "", "tool_calls": [call("s2")]}


async def test_default_view_starts_after_last_anchor(tape):
    await tape.ensure_bootstrap_anchor()
    await tape.append_many([user("phase one"), assistant("ok one")])
    assert [m["content"] for m in await tape.read_messages()] == ["phase one", "ok one"]
    await tape.append(TapeEntry.anchor("checkpoint", {"n": 1}))
    await tape.append_many([user("phase two")])
    assert await tape.read_messages() == [{"role": "user", "content": "phase two"}]


async def test_handoff_writes_anchor_and_event_and_context_starts_after(tape):
    await tape.ensure_bootstrap_anchor()
    await tape.append_many([user("old question"), assistant("old answer")])
    anchor = await tape.handoff("handoff", {"summary": "we talked", "owner": "human"})
    assert anchor.kind == "anchor"
    assert anchor.id == 4
    assert anchor.payload == {
        "name": "handoff",
        "state": {"summary": "we talked", "owner": "human"},
    }
    written = await tape.query(after_id=3)
    assert [(e.kind, e.name) for e in written] == [("anchor", "handoff"), ("event", "handoff")]
    assert written[1].payload["data"] == {
        "name": "handoff",
        "state": {"summary": "we talked", "owner": "human"},
    }
    # The handoff does not inject its state: the new phase starts empty.
    assert await tape.read_messages() == []
    await tape.append(user("new question"))
    assert await tape.read_messages() == [{"role": "user", "content": "new question"}]
    info = await tape.info()
    assert info.last_anchor == "handoff"
    assert info.entries_since_anchor == 2


async def test_handoff_then_entries_follow_the_anchor(tape):
    summary = TapeEntry.message({"role": "user", "content": "Summary so far: x"})
    await tape.handoff("handoff", {"summary": "x"}, then=[summary])
    assert await tape.read_messages() == [{"role": "user", "content": "Summary so far: x"}]


async def test_anchors_render_in_non_default_views(tape):
    await tape.ensure_bootstrap_anchor()
    await tape.append(user("one"))
    await tape.handoff("phase/2", {"summary": "总结 🎉", "n": 2})
    await tape.append(user("two"))
    await tape.append(TapeEntry.anchor("phase/3"))
    await tape.append(user("three"))

    # Default view: after the last anchor, no anchor text.
    assert await tape.read_messages() == [{"role": "user", "content": "three"}]

    # After a named anchor with later anchors: those render as assistant messages.
    messages = await tape.read_messages(after_anchor="session/start")
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"] == "one"
    assert parse_anchor(messages[1]) == ("phase/2", {"summary": "总结 🎉", "n": 2})
    assert "总结 🎉" in messages[1]["content"]  # Unicode kept readable, not \u-escaped
    assert parse_anchor(messages[3]) == ("phase/3", {})
    assert messages[4]["content"] == "three"

    whole = await tape.read_messages(after_id=0)
    assert parse_anchor(whole[0]) == ("session/start", {"owner": "human"})

    between = await tape.read_messages(between=("session/start", "phase/3"))
    assert len(between) == 3
    assert between[0] == {"role": "user", "content": "one"}
    assert parse_anchor(between[1])[0] == "phase/2"
    assert between[2] == {"role": "user", "content": "two"}


async def test_custom_selector_replaces_the_default(tape):
    await tape.append_many(
        [
            user("hi"),
            TapeEntry.event("run", {"usage": {"total_tokens": 3}}),
            TapeEntry.tool_call([call("c")]),
        ]
    )

    def only_events(entries: Sequence[TapeEntry]) -> list[dict[str, Any]]:
        return [
            {"role": "user", "content": f"event {e.name}"} for e in entries if e.kind == "event"
        ]

    assert await tape.read_messages(selector=only_events) == [
        {"role": "user", "content": "event run"}
    ]
    assert await tape.read_messages() == [{"role": "user", "content": "hi"}]


async def test_selector_does_not_mutate_entries(tape):
    await tape.append_many(
        [
            assistant("thinking"),
            TapeEntry.tool_call([call("c")]),
            TapeEntry.tool_result([result("c", "r")]),
        ]
    )
    entries = await tape.read_entries()
    first = default_selector(entries)
    second = default_selector(entries)
    assert first == second
    assert entries[0].payload == {"role": "assistant", "content": "thinking"}
    assert visible(entries) == entries
