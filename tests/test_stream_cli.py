"""The terminal streams: `bub-bot run` / `chat` print the answer as it is written on a
terminal, and a pipe gets exactly the bytes it got without streaming."""

from __future__ import annotations

import asyncio
import io
import os
import pty

from bub_bot.server import Bot
from channels.cli import DIM, CliChannel
from tests.fakes.openai_server import streamed, text, tool_calls
from tests.test_cli import BUB, AnsweringFake, bub, env, fake

__all__ = ["env", "fake"]  # fixtures


class Terminal(io.StringIO):
    """stdout as a terminal, recording each write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


async def talk(settings, out: io.StringIO, *messages: str) -> CliChannel:
    channel = CliChannel(out)
    bot = await Bot.open(settings, [channel])
    try:
        for message in messages:
            inbound = channel.inbound(message)
            await bot.runtime.receive(inbound)
            await bot.runtime.wait_idle(inbound.session_id, 10)
    finally:
        await bot.close()
    return channel


async def test_terminal_prints_as_the_model_writes(settings, fake_openai) -> None:
    answer = "One, two, three, four, five."
    fake_openai.script(
        streamed(tool_calls([("tape.info", {})], content="Checking first."), seconds=0.1),
        streamed(text(answer), chunks=8, seconds=0.4),
    )
    out = Terminal()
    channel = await talk(settings(stream_interval_ms=0), out, "count")
    shown = out.getvalue()
    assert shown.startswith("Checking first.\n")
    assert f"{DIM}… using tape.info…" in shown
    assert shown.endswith(answer + "\n") and shown.count(answer) == 1
    answer_writes = [w for w in out.writes if w and w in answer]
    assert len(answer_writes) >= 4  # the answer came in pieces, as it was written
    assert channel.sent == [answer]


async def test_a_pipe_gets_the_same_bytes_as_without_streaming(settings, fake_openai) -> None:
    script = (
        streamed(tool_calls([("tape.info", {})], content="Checking first."), seconds=0.05),
        streamed(text("The answer."), chunks=4, seconds=0.1),
    )
    fake_openai.script(*script)
    piped = io.StringIO()
    await talk(settings(), piped, "q")
    fake_openai.script(*script)
    plain = io.StringIO()
    await talk(settings(stream=False), plain, "q")
    assert piped.getvalue() == plain.getvalue() == "The answer.\n"
    assert "\x1b" not in piped.getvalue()


async def test_bub_run_in_a_terminal_shows_text_before_the_answer_is_done(
    env, tmp_path, fake: AnsweringFake
) -> None:
    answer = "Streaming to a terminal works word by word, as it should."
    fake.script(streamed(text(answer), chunks=10, seconds=2.0))
    master, slave = pty.openpty()
    os.set_blocking(master, False)
    proc = await asyncio.create_subprocess_exec(
        *BUB, "run", "go", env=env, cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave
    )
    os.close(slave)
    seen = b""
    early = b""
    try:
        async with asyncio.timeout(20):
            while proc.returncode is None:
                try:
                    seen += os.read(master, 4096)
                except (BlockingIOError, OSError):
                    await asyncio.sleep(0.02)
                if not early and answer[:5].encode() in seen and fake.streams:
                    early = seen
                    assert not fake.streams[0].completed  # the model is still writing
                if answer.encode() in seen:
                    break
            assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        os.close(master)
    assert early and answer.encode() not in early
    assert seen.count(answer.encode()) == 1


async def test_bub_run_piped_prints_only_the_answer(env, tmp_path, fake: AnsweringFake) -> None:
    fake.script(
        streamed(tool_calls([("tape.info", {})], content="thinking aloud")),
        streamed(text("Final words."), chunks=3, seconds=0.1),
    )
    code, out, err = await bub("run", "go", env=env, cwd=tmp_path)
    assert code == 0, err
    assert out == "Final words.\n"
