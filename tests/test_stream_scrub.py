"""Secrets in a streamed answer: the partial texts shown while the model writes never show a
secret or the beginning of one that could still be completed, each is the beginning of the
final text, and the final text is scrubbed whole, exactly like a non-streamed answer.

The property test feeds random texts, split at random, through `ScrubbedText` with sets of
secrets chosen to be awkward: a secret that starts and ends with the same character, secrets
that overlap, a secret that is the beginning of another, one that repeats itself."""

from __future__ import annotations

import json
import random

import pytest

from bub_bot.agent import ModelClient, Progress
from bub_bot.agent.streaming import Assembler, ScrubbedText
from bub_bot.secrets import REDACTED, Scrubber
from tests.fakes.openai_server import FakeOpenAI, raw, streamed, text, tool_calls

USER = [{"role": "user", "content": "what is the key?"}]
KEY = "sk-live-0123456789abcdefs"  # starts and ends with "s"

SECRET_SETS = [
    [KEY],
    ["sk-proj-9f8e7d6c5b4a3x", "xoxb-1111-2222-abcdefabcdef"],  # one ends where one starts
    ["abcab", "cabde"],  # overlapping
    ["secret", "secret-long"],  # one is the beginning of the other
    ["aaab", "abab"],  # repeating themselves
    ["xyzx", "zxq", "xq"],
    ["ab", "abc", "abcd", "bcd"],
]


def _text(rng: random.Random, secrets: list[str]) -> str:
    """A text made of secrets, their beginnings and ends, and letters they use."""
    letters = "".join(sorted(set("".join(secrets)))) + " -"
    parts = []
    for _ in range(rng.randint(1, 12)):
        secret = rng.choice(secrets)
        pick = rng.random()
        if pick < 0.35:
            parts.append(secret)
        elif pick < 0.6:
            parts.append(secret[: rng.randint(1, len(secret))])
        elif pick < 0.75:
            parts.append(secret[rng.randint(0, len(secret) - 1) :])
        else:
            parts.append("".join(rng.choice(letters) for _ in range(rng.randint(1, 4))))
    return "".join(parts)


def _split(rng: random.Random, whole: str) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(whole)), min(len(whole) - 1, rng.randint(0, 8))))
    if rng.random() < 0.3:
        cuts = list(range(1, len(whole)))  # a character at a time
    return [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)]


def _continuations(so_far: str, secrets: list[str], rest: str) -> list[str]:
    """What may follow: the real rest, nothing, and every way to complete a secret whose
    beginning the text so far ends with."""
    out = [rest, ""]
    for secret in secrets:
        for j in range(1, len(secret)):
            if so_far.endswith(secret[:j]):
                out += [secret[j:], secret[j:] + "!"]
    return out


@pytest.mark.parametrize("secrets", SECRET_SETS, ids=lambda s: "|".join(s))
def test_partials_are_the_beginning_of_the_scrubbed_whole(secrets: list[str]) -> None:
    scrub = Scrubber(secrets)
    rng = random.Random(f"stream-scrub {secrets}")
    for _ in range(150):
        whole = _text(rng, secrets)
        final = scrub.text(whole)
        streamed = ScrubbedText(scrub)
        so_far = ""
        pieces = _split(rng, whole)
        for piece in pieces:
            streamed.add(piece)
            so_far += piece
            shown = streamed.text
            assert not any(s in shown for s in secrets), (pieces, shown)
            # Decided whatever follows: the secret that might be completed was held back.
            for more in _continuations(so_far, secrets, whole[len(so_far) :]):
                assert scrub.text(so_far + more).startswith(shown), (pieces, shown, more)
            assert streamed.held < scrub.longest  # and nothing more waits
        assert streamed.finish() == final, pieces


def test_a_delta_ending_where_a_secret_ends() -> None:
    """The reviewer's case: the key ends with the letter it starts with, and a delta ends
    with the key: its last letter could start a key, the rest must not go out unscrubbed."""
    streamed = ScrubbedText(Scrubber([KEY]))
    streamed.add("the key is " + KEY)
    assert streamed.text == "the key is " + REDACTED  # the match is decided: nothing held
    streamed.add(" ok")
    assert streamed.finish() == f"the key is {REDACTED} ok"
    slack = "xoxb-1111-2222-abcdefabcdef"
    streamed = ScrubbedText(Scrubber(["sk-proj-9f8e7d6c5b4a3x", slack]))
    streamed.add("use sk-proj-9f8e7d6c5b4a3x")
    streamed.add(" please")
    assert streamed.finish() == f"use {REDACTED} please"


def sse(*pieces: str) -> bytes:
    out = []
    for piece in pieces:
        chunk = {
            "id": "c",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
        }
        out.append(f"data: {json.dumps(chunk)}\n\n")
    end = {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    out.append(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n")
    return "".join(out).encode()


async def test_streamed_and_plain_answers_are_scrubbed_alike(fake_openai: FakeOpenAI, settings):
    answer = ("the key is ", KEY, " -- keep it safe, s", "k-live-0123456789abcdefs twice")
    fake_openai.script(raw(sse(*answer), "text/event-stream"), text("".join(answer)))
    client = ModelClient(settings(openai_api_key=KEY))
    seen: list[str] = []
    try:
        streamed = await client.complete(USER, on_progress=lambda p: seen.append(p.text))
        plain = await client.complete(USER)
    finally:
        await client.close()
    assert streamed.extra == {"streamed": True} and "streamed" not in plain.extra
    assert (
        streamed.content
        == plain.content
        == (f"the key is {REDACTED} -- keep it safe, {REDACTED} twice")
    )
    assert seen and all(KEY[:8] not in t and plain.content.startswith(t) for t in seen)


def test_tool_names_in_the_status_are_scrubbed() -> None:
    seen: list[Progress] = []
    assembler = Assembler(Scrubber([KEY]), seen.append)
    call = {"index": 0, "id": "t1", "function": {"name": f"fetch_{KEY}", "arguments": "{}"}}
    assembler.add({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    assert [p.tools for p in seen if p.kind == "tools"] == [(f"fetch_{REDACTED}",)]


@pytest.mark.parametrize("stream", [True, False])
async def test_a_turn_shows_scrubbed_tool_names(fake_openai: FakeOpenAI, agent, tape, stream):
    """The status between steps (from the stream, and from the finished step's calls)."""
    fake_openai.script(
        streamed(tool_calls([(f"fetch_{KEY}", {})])), streamed(text("done"), chunks=2)
    )
    seen: list[Progress] = []
    result = await agent(openai_api_key=KEY, stream=stream).run_turn(
        tape, [{"role": "user", "content": "hi"}], progress=seen.append
    )
    assert result.reply == "done"
    shown = [p.tools for p in seen if p.kind == "tools"]
    assert shown and all(names == (f"fetch_{REDACTED}",) for names in shown), shown
