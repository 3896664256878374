"""`bub-bot chat` and `bub-bot run`: the terminal channel through the real runtime."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from functools import partial

from channels.cli import CliChannel

from .config import Settings
from .server import Bot


async def run_once(settings: Settings, message: str, session: str = "local") -> int:
    """Send one message, print the reply; non-zero with a one-line reason if the turn failed."""
    channel = CliChannel()
    bot = await Bot.open(settings, [channel])
    outcomes: list[str] = []
    bot.runtime.observers.append(
        lambda event, data: outcomes.append(data["outcome"]) if event == "turn" else None
    )
    try:
        inbound = channel.inbound(message, session)
        await bot.runtime.receive(inbound)
        await bot.runtime.wait_idle(inbound.session_id)
        await _answer_requests(bot, channel, asyncio.get_running_loop(), sys.stdin.isatty())
    finally:
        await bot.close()
    if outcomes and outcomes[-1] not in ("ok", "auto_handoff"):
        reason = channel.sent[-1] if channel.sent else outcomes[-1]
        print(f"bub-bot: turn ended with {outcomes[-1]}: {reason}", file=sys.stderr)
        return 1
    return 0


async def chat(settings: Settings, session: str = "local") -> int:
    """An interactive conversation on stdin/stdout; Ctrl-D or Ctrl-C ends it."""
    channel = CliChannel()
    bot = await Bot.open(settings, [channel])
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"bub-bot chat — session cli:{session}. /help for commands, Ctrl-D to quit.")
    loop = asyncio.get_running_loop()
    session_id = f"cli:{session}"
    # A message left unanswered by a crash is answered now (once).
    if await bot.runtime.resume({session_id}):
        await bot.runtime.wait_idle(session_id)
    try:
        while True:
            if interactive:
                print("> ", end="", flush=True)
            line = await _read_line(loop)
            if not line:
                break
            text = line.rstrip("\n")
            if not text.strip():
                continue
            inbound = channel.inbound(text, session)
            await bot.runtime.receive(inbound)
            await bot.runtime.wait_idle(inbound.session_id)
            await _answer_requests(bot, channel, loop, True)
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass
    finally:
        if interactive:
            print()
        await bot.close()
    return 0


async def _answer_requests(
    bot: Bot, channel: CliChannel, loop: asyncio.AbstractEventLoop, ask: bool
) -> None:
    """Ask y/N for each approval request the turns posted (without a terminal to ask: no,
    so nothing runs unapproved), and wait for the turn that follows each answer."""
    while channel.asking:
        session, request = channel.asking.pop(0)
        answer = ""
        if ask:
            print("Approve? [y/N] ", end="", flush=True)
            answer = await _read_line(loop)
        outcome = await bot.runtime.decide(channel.click(session, request, answer))
        if outcome not in ("approve", "deny"):
            print(f"({outcome})", flush=True)
        await bot.runtime.wait_idle(f"cli:{session}")


async def _read_line(loop: asyncio.AbstractEventLoop) -> str:
    """One line of stdin ('' at end of input) from a daemon thread.

    Not the loop's default executor: `asyncio.run` joins executor threads on exit, so a
    Ctrl-C at the prompt would hang until the user pressed Enter.
    """
    future: asyncio.Future[str] = loop.create_future()

    def settle(line: str | None, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(line or "")

    def read() -> None:
        try:
            result = partial(settle, sys.stdin.readline(), None)
        except Exception as exc:  # stdin closed or undecodable
            result = partial(settle, None, exc)
        with contextlib.suppress(RuntimeError):  # the loop is closed: we are exiting
            loop.call_soon_threadsafe(result)

    threading.Thread(target=read, name="stdin", daemon=True).start()
    return await future
