"""reset(archive=True) is atomic: SIGKILL a process in a reset loop, reopen, check invariants
(on a SQLite file and on a PostgreSQL database)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import sys
from pathlib import Path

from bub_bot.tape import BOOTSTRAP_ANCHOR, TapeStore, open_store, sidecar_name
from bub_bot.tape.names import tape_role

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).with_name("tape_crash_child.py")
TAPE = "crashtape"
RESETS_BEFORE_KILL = 20


async def run_and_kill(db: str, rng: random.Random) -> int:
    """Start the child, wait for some resets, SIGKILL it at a random moment; resets it printed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        db,
        TAPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    printed = 0
    try:
        async with asyncio.timeout(10):
            while printed < RESETS_BEFORE_KILL:
                line = await proc.stdout.readline()
                if not line:
                    err = await proc.stderr.read()
                    raise AssertionError(f"child exited early: {err.decode()}")
                if line.startswith(b"reset "):
                    printed = int(line.split()[1])
        # Let it run on for a random moment, so the kill lands anywhere in the loop.
        await asyncio.sleep(rng.uniform(0.0, 0.05))
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        # Drain whatever it printed before dying: those resets were committed.
        rest = await proc.stdout.read()
        err = await proc.stderr.read()
        await proc.wait()
    for line in rest.splitlines():
        if line.startswith(b"reset "):
            printed = int(line.split()[1])
    assert proc.returncode == -signal.SIGKILL, err.decode()
    return printed


async def orphans(store: TapeStore) -> int:
    """Entry rows whose tape row is gone, counted around the store."""
    if store.kind == "sqlite":
        conn = sqlite3.connect(store.path)  # type: ignore[attr-defined]
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            return conn.execute(
                "SELECT count(*) FROM entries WHERE tape NOT IN (SELECT id FROM tapes)"
            ).fetchone()[0]
        finally:
            conn.close()
    async with store.pool.acquire() as conn:  # type: ignore[attr-defined]
        return await conn.fetchval(
            "SELECT count(*) FROM bub_entries WHERE tape NOT IN (SELECT id FROM bub_tapes)"
        )


async def read_all(db: str) -> tuple[dict[str, list[tuple]], dict[str, str]]:
    """Every tape's entries (id, kind, name, payload JSON) and role; ids checked dense."""
    async with open_store(db) as store:
        assert await orphans(store) == 0
        per_tape: dict[str, list[tuple]] = {}
        roles: dict[str, str] = {}
        for summary in await store.list_tapes(include_all=True):
            rows = [
                (e.id, e.kind, e.name, json.dumps(e.payload))
                for e in await store.query(summary.name)
            ]
            ids = [r[0] for r in rows]
            # Dense 1..N (counters are derived from these rows, so they agree by design).
            assert ids == list(range(1, len(ids) + 1)), (summary.name, ids[:10])
            per_tape[summary.name] = rows
            roles[summary.name] = tape_role(summary.name)
        return per_tape, roles


async def check_invariants(db: str) -> int:
    """All reset invariants; returns the number of archives."""
    per_tape, roles = await read_all(db)
    assert TAPE in per_tape, "the live tape vanished"
    assert roles[TAPE] == "live"

    archives = {n for n, r in roles.items() if r == "archive" and "__sidecar__" not in n}
    referenced: list[str] = []
    unarchived_starts = 0
    main_tapes = [TAPE, *archives]
    for name in main_tapes:
        rows = per_tape[name]
        # Every main tape (live or archived) starts with session/start: a reset never leaves
        # an empty live tape or one without its anchor.
        assert rows, f"{name} is empty"
        first_id, kind, anchor_name, payload = rows[0]
        assert (first_id, kind, anchor_name) == (1, "anchor", BOOTSTRAP_ANCHOR), name
        state = json.loads(payload)["state"]
        assert state["owner"] == "human"
        if "archived" in state:
            referenced.append(state["archived"])
        else:
            unarchived_starts += 1
        # session/start appears only as the first entry.
        assert [r for r in rows[1:] if r[2] == BOOTSTRAP_ANCHOR] == [], name

    # Exactly one original bootstrap; every archive is referenced once by a session/start, and
    # every reference names an archive that exists (no archive without its new anchor, no anchor
    # pointing at nothing).
    assert unarchived_starts == 1
    assert sorted(referenced) == sorted(archives)
    assert len(set(referenced)) == len(referenced)

    # The references form one chain from the live tape back to the first tape.
    seen = 0
    state = json.loads(per_tape[TAPE][0][3])["state"]
    while "archived" in state:
        seen += 1
        state = json.loads(per_tape[state["archived"]][0][3])["state"]
    assert seen == len(archives)

    # Each archive took its spill sidecar along (the child spills before every reset).
    for name in archives:
        side = sidecar_name(name, "spill")
        assert roles.get(side) == "archive", side
        assert [r[1] for r in per_tape[side]][:3] == ["anchor", "tool_result", "anchor"]
        assert len(per_tape[side]) % 3 == 0
    # A live sidecar, if any, holds only what was spilled after the last reset.
    live_side = per_tape.get(sidecar_name(TAPE, "spill"), [])
    assert len(live_side) <= 3
    return len(archives)


async def check_through_store(db: str) -> None:
    async with open_store(db) as store:
        live = {t.name for t in await store.list_tapes()}
        assert live == {TAPE, f"{TAPE}-other"}
        first = await store.query(TAPE, limit=1)
        assert first[0].kind == "anchor" and first[0].name == BOOTSTRAP_ANCHOR
        archived = first[0].payload["state"]["archived"]
        old = await store.query(archived)
        assert old[0].name == BOOTSTRAP_ANCHOR
        assert [e.id for e in old] == list(range(1, len(old) + 1))
        assert await store.query(sidecar_name(archived, "spill"))


async def test_sigkill_during_reset_loop_keeps_tapes_consistent(store_url: str):
    db = store_url
    rng = random.Random()
    printed_total = 0
    for round_ in range(3):
        printed = await run_and_kill(db, rng)
        printed_total += printed
        archives = await check_invariants(db)
        # Every reset the child reported is durable; at most one per kill committed unreported.
        assert printed_total <= archives <= printed_total + round_ + 1
        await check_through_store(db)
