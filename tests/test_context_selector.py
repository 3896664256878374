"""BUB_CONTEXT_SELECTOR: a selector loaded by reference replaces the default for every model
call; a bad reference fails the start naming the setting."""

from __future__ import annotations

import pytest

from bub_bot.config import ConfigError
from bub_bot.tape import TapeEntry
from tests.fakes.openai_server import text


async def test_a_selector_by_reference_is_used(fake_openai, agent, tape) -> None:
    made = agent(context_selector="tests.selector_last_two:select")
    await tape.append_many(
        [TapeEntry.message({"role": "user", "content": f"old {i}"}) for i in range(3)],
        bootstrap=True,
    )
    fake_openai.script(text("ok"))
    await made.run_turn(tape, [{"role": "user", "content": "newest"}])
    sent = fake_openai.last_messages()
    assert [m["content"] for m in sent[1:]] == ["old 2", "newest"]
    assert sent[0]["role"] == "system"


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("no_colon", "is not of the form module:function"),
        ("tests.no_such_module:select", "cannot import 'tests.no_such_module'"),
        ("tests.selector_last_two:missing", "has no 'missing'"),
        ("tests.selector_last_two:NOT_CALLABLE", "is not callable"),
    ],
)
def test_a_bad_reference_fails_the_start(settings, ref: str, why: str) -> None:
    with pytest.raises(ConfigError) as raised:
        settings(context_selector=ref).check()
    assert str(raised.value).startswith("BUB_CONTEXT_SELECTOR: ") and why in str(raised.value)
