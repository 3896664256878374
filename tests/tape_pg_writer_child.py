"""Child process for test_tape_postgres: writes to shared tapes of one PostgreSQL database.

    python tests/tape_pg_writer_child.py <url> <worker> <rounds>

Prints `ready` once connected, waits for a line on stdin (so every worker starts together),
then: appends to the tape `shared` (singles and pairs, four at a time), to its sidecar, and
worker 0 resets `shared` twice along the way; every worker tries the same ten dedupe keys and
bootstraps the tape `boot`. Prints one JSON line with what it wrote.
"""

from __future__ import annotations

import asyncio
import json
import sys

from bub_bot.tape import Tape, TapeEntry, open_store


def msg(text: str) -> TapeEntry:
    return TapeEntry.message({"role": "user", "content": text})


async def main(url: str, worker: int, rounds: int) -> None:
    async with open_store(url, pool_size=4) as store:
        shared = Tape(store, "shared", session_id="test:shared")
        spill = shared.sidecar("spill")
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        written: list[str] = []

        async def one(i: int) -> None:
            label = f"w{worker}-{i}"
            if i % 3 == 0:
                await store.append_many("shared", [msg(f"{label}a"), msg(f"{label}b")])
                written.extend([f"{label}a", f"{label}b"])
            else:
                await store.append("shared", msg(label))
                written.append(label)
            await spill.append(msg(f"spill-{label}"))

        resets = 0
        for start in range(0, rounds, 4):
            await asyncio.gather(*(one(i) for i in range(start, min(rounds, start + 4))))
            if worker == 0 and start in (rounds // 3 // 4 * 4, 2 * rounds // 3 // 4 * 4):
                await shared.reset()
                resets += 1
        won = 0
        for k in range(10):
            got = await store.append_many(
                "dedupe", [msg(f"delivery {k} via w{worker}")], dedupe_keys=[f"delivery:{k}"]
            )
            won += got is not None
        booted = await Tape(store, "boot").ensure_bootstrap_anchor()
    print(
        json.dumps(
            {"written": written, "resets": resets, "won": won, "booted": booted is not None}
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
