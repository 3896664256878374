"""Crash-test helper (run by test_tape_reset_crash.py): append, spill, reset — until killed.

Usage: python tests/tape_crash_child.py <database URL or SQLite path> <tape name>

Prints `ready` once the store is open, then `reset <n>` after each committed reset. A second
tape ("<tape>-other") gets appends concurrently so more than one tape is written when the
process is killed.
"""

from __future__ import annotations

import asyncio
import sys

from bub_bot.tape import Tape, TapeEntry, open_store


async def churn(tape: Tape) -> None:
    n = 0
    while True:
        n += 1
        await tape.append_many(
            [
                TapeEntry.message({"role": "user", "content": f"other {n}"}),
                TapeEntry.event("run", {"n": n}),
            ]
        )
        await asyncio.sleep(0)


async def main(path: str, name: str) -> None:
    store = await open_store(path)
    tape = Tape(store, name, session_id="crash:test")
    await tape.ensure_bootstrap_anchor()
    spill = tape.sidecar("spill")
    other = asyncio.create_task(churn(Tape(store, f"{name}-other")))
    print("ready", flush=True)
    resets = 0
    while True:
        step = resets + 1
        await tape.append_many(
            [
                TapeEntry.message({"role": "user", "content": f"question {step} 你好"}),
                TapeEntry.tool_call(
                    [
                        {
                            "id": f"c{step}",
                            "type": "function",
                            "function": {"name": "fs.read", "arguments": "{}"},
                        }
                    ]
                ),
                TapeEntry.tool_result([{"tool_call_id": f"c{step}", "content": "preview…"}]),
            ]
        )
        await spill.append_many(
            [
                TapeEntry.anchor(f"spill/h{step}/chunk/0"),
                TapeEntry.tool_result([{"tool_call_id": f"c{step}", "content": "x" * 2000}]),
                TapeEntry.anchor(f"spill/h{step}/manifest", {"chunks": 1}),
            ]
        )
        await tape.append(TapeEntry.message({"role": "assistant", "content": f"answer {step}"}))
        await tape.reset(archive=True)
        resets += 1
        print(f"reset {resets}", flush=True)
        if other.done():
            other.result()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
