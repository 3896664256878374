"""Usage counters in both stores: atomic adds with an append, in one transaction; a refused
append adds nothing; `decide` replaces what is written from the counts; restarts keep them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bub_bot.tape import Counting, TapeEntry, TapeStore, UsageAdd, open_store


def msg(text: str) -> TapeEntry:
    return TapeEntry.message({"role": "user", "content": text}, inbound=True)


async def test_adds_with_an_append_and_alone(any_store: TapeStore) -> None:
    adds = (UsageAdd("u:web:a", "d:2026-12-02", 1, 10, 5, 70), UsageAdd("t", "d:2026-12-02", 1))
    await any_store.append_many("t1", [msg("hi")], usage=Counting(adds))
    await any_store.append_many("t1", [msg("again")], usage=Counting(adds))
    await any_store.add_usage([UsageAdd("u:web:a", "d:2026-12-03", tokens_out=3, estimated=3)])
    rows = await any_store.usage(["u:web:a", "t"], "d:2026-12-01", "d:2026-12-31")
    got = {(r.key, r.window): (r.messages, r.tokens_in, r.tokens_out, r.cost) for r in rows}
    assert got == {
        ("u:web:a", "d:2026-12-02"): (2, 20, 10, 140),
        ("t", "d:2026-12-02"): (2, 0, 0, 0),
        ("u:web:a", "d:2026-12-03"): (0, 0, 3, 0),
    }
    assert await any_store.usage(["u:web:a"], "d:2026-11-01", "d:2026-11-30") == []
    top = await any_store.top_usage("u:", "d:2026-12-01", "d:2026-12-31")
    assert [(r.key, r.tokens, r.estimated) for r in top] == [("u:web:a", 33, 3)]


async def test_a_duplicate_adds_nothing_and_decide_rewrites(any_store: TapeStore) -> None:
    seen: list[list[int]] = []

    def decide(counts: list[int]) -> list[TapeEntry] | None:
        seen.append(counts)
        if counts[0] <= 1:
            return None
        return [TapeEntry.message({"role": "user", "content": "x"}, refused={"n": counts[0]})]

    counting = Counting((UsageAdd("u:x", "m:1", 1),), decide)
    first = await any_store.append_many("t2", [msg("a")], dedupe_keys=["k1"], usage=counting)
    dup = await any_store.append_many("t2", [msg("a")], dedupe_keys=["k1"], usage=counting)
    second = await any_store.append_many("t2", [msg("b")], dedupe_keys=["k2"], usage=counting)
    assert first is not None and "refused" not in first[0].meta
    assert dup is None
    assert second is not None and second[0].meta["refused"] == {"n": 2}
    stored = await any_store.query("t2")
    assert [e.meta.get("refused") for e in stored] == [None, {"n": 2}]
    rows = await any_store.usage(["u:x"], "m:1", "m:1")
    assert rows[0].messages == 2  # the duplicate was rolled back with its counters


async def test_concurrent_adds_are_not_lost(any_store: TapeStore) -> None:
    add = (UsageAdd("t", "d:x", 1, 1, 1),)
    await asyncio.gather(
        *(any_store.append_many(f"tape{i % 4}", [msg("m")], usage=Counting(add)) for i in range(40))
    )
    (row,) = await any_store.usage(["t"], "d:x", "d:x")
    assert (row.messages, row.tokens) == (40, 80)


async def test_restart_keeps_counters(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'u.db'}"
    async with open_store(url) as store:
        await store.add_usage([UsageAdd("t", "d:1", tokens_in=7)])
    async with open_store(url) as store:
        (row,) = await store.usage(["t"], "d:1", "d:1")
    assert row.tokens_in == 7


async def test_prune_drops_only_old_short_windows(any_store: TapeStore) -> None:
    windows = ["m:2026-12-01T23:59", "m:2026-12-02T00:00", "h:2026-11-30T10", "d:2026-11-01"]
    await any_store.add_usage([UsageAdd("u:a", w, 1) for w in windows] + [UsageAdd("M:x", "M:1")])
    assert await any_store.prune_usage(["h:2026-12-02", "m:2026-12-02"]) == 2
    rows = await any_store.usage(["u:a"], "", "zz")
    assert sorted(r.window for r in rows) == ["d:2026-11-01", "m:2026-12-02T00:00"]


async def test_tapes_copy_carries_the_counters_once(tmp_path: Path, pg_url: str) -> None:
    from bub_bot.tape.copy import copy_tapes

    async with open_store(f"sqlite:///{tmp_path / 'src.db'}") as src, open_store(pg_url) as dst:
        adds = [UsageAdd(f"u:web:{n}", "d:2026-12-02", 1, n, n) for n in range(25)]
        await src.add_usage([*adds, UsageAdd("t", "d:2026-12-02", 25, 300, 300, 9)])
        first = await copy_tapes(src, dst, batch=10)
        again = await copy_tapes(src, dst, batch=10)
        assert (first.usage_rows, again.usage_rows) == (26, 0)
        (total,) = await dst.usage(["t"], "d:2026-12-02", "d:2026-12-02")
        assert (total.messages, total.tokens, total.cost) == (25, 600, 9)
        assert len(await dst.usage_records(limit=100)) == 26
