"""Both tape stores and Tape against real databases: queries, ids, transactions, errors.

Tests taking `store` run once on a SQLite file and once on a PostgreSQL database (the
`any_store` fixture); the opening tests at the end are about SQLite files.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from bub_bot.tape import (
    BOOTSTRAP_ANCHOR,
    AnchorNotFound,
    DedupeRecord,
    PayloadError,
    SQLiteTapeStore,
    Tape,
    TapeEntry,
    TapeStats,
    TapeStore,
    TapeStoreError,
    open_store,
    sidecar_name,
)
from bub_bot.tape.schema import SQLITE_MIGRATIONS as MIGRATIONS
from bub_bot.tape.schema import SQLITE_VERSION as SCHEMA_VERSION
from bub_bot.tape.schema import migrate_sqlite as migrate


@pytest.fixture
def store(any_store: TapeStore) -> TapeStore:
    return any_store


def msg(text: str, role: str = "user", **meta) -> TapeEntry:
    return TapeEntry.message({"role": role, "content": text}, **meta)


def texts(entries: list[TapeEntry]) -> list[str]:
    """A compact label per entry: message content, or `kind:name`."""
    out = []
    for e in entries:
        if e.kind == "message":
            out.append(e.payload["content"])
        else:
            out.append(f"{e.kind}:{e.name}")
    return out


async def all_entries(store: TapeStore, tape: str) -> list[TapeEntry]:
    return await store.query(tape)


# -- query forms -----------------------------------------------------------------------------


@pytest.fixture
async def anchored(store):
    """m1 A m2 B m3 A m4 C m5 (ids 1..9)."""
    entries = [
        msg("m1"),
        TapeEntry.anchor("A", {"n": 1}),
        msg("m2"),
        TapeEntry.anchor("B"),
        msg("m3"),
        TapeEntry.anchor("A", {"n": 2}),
        msg("m4"),
        TapeEntry.anchor("C"),
        msg("m5"),
    ]
    await store.append_many("t", entries)
    return store


async def test_query_all_is_oldest_first_with_dense_ids(anchored):
    found = await anchored.query("t")
    assert [e.id for e in found] == list(range(1, 10))
    assert texts(found) == [
        "m1",
        "anchor:A",
        "m2",
        "anchor:B",
        "m3",
        "anchor:A",
        "m4",
        "anchor:C",
        "m5",
    ]


async def test_query_after_last_anchor(anchored):
    assert texts(await anchored.query("t", after_last_anchor=True)) == ["m5"]
    assert texts(await anchored.read_context("t")) == ["m5"]
    await anchored.append("t", msg("m6"))
    assert texts(await anchored.query("t", after_last_anchor=True)) == ["m5", "m6"]


async def test_query_after_last_anchor_without_any_anchor_is_whole_tape(store):
    await store.append_many("t", [msg("a"), msg("b")])
    assert texts(await store.query("t", after_last_anchor=True)) == ["a", "b"]


async def test_query_after_named_anchor_uses_its_last_occurrence(anchored):
    assert texts(await anchored.query("t", after_anchor="A")) == ["m4", "anchor:C", "m5"]
    assert texts(await anchored.query("t", after_anchor="B")) == [
        "m3",
        "anchor:A",
        "m4",
        "anchor:C",
        "m5",
    ]
    assert await anchored.query("t", after_anchor="C", kinds=["anchor"]) == []


async def test_query_between_two_named_anchors(anchored):
    # After the last B, up to the first A that follows it.
    assert texts(await anchored.query("t", between=("B", "A"))) == ["m3"]
    # After the last A, up to the first C after it.
    assert texts(await anchored.query("t", between=("A", "C"))) == ["m4"]
    # No end anchor after the start: runs to the end of the tape.
    assert texts(await anchored.query("t", between=("C", "B"))) == ["m5"]


async def test_unknown_anchor_raises(anchored):
    with pytest.raises(AnchorNotFound, match="nope"):
        await anchored.query("t", after_anchor="nope")
    with pytest.raises(AnchorNotFound, match="nope"):
        await anchored.query("t", between=("nope", "A"))
    # An event with the name is not an anchor.
    await anchored.append("t", TapeEntry.event("evt"))
    with pytest.raises(AnchorNotFound):
        await anchored.query("t", after_anchor="evt")
    # A tape that was never written has no anchors either.
    with pytest.raises(AnchorNotFound):
        await anchored.query("never-written", after_anchor="A")
    assert await anchored.query("never-written") == []


async def test_query_by_kinds_and_names(store):
    await store.append_many(
        "t",
        [
            msg("u1"),
            msg("a1", role="assistant"),
            TapeEntry.event("run", {"usage": {"total_tokens": 1}}),
            TapeEntry.event("loop.step"),
            TapeEntry.anchor("A"),
            TapeEntry.system("sys"),
            TapeEntry.error("boom", "it broke"),
            msg("u2"),
        ],
    )
    assert texts(await store.query("t", kinds=["message"])) == ["u1", "a1", "u2"]
    assert texts(await store.query("t", kinds=["event", "anchor"])) == [
        "event:run",
        "event:loop.step",
        "anchor:A",
    ]
    assert texts(await store.query("t", kinds=["system", "error"])) == ["system:None", "error:None"]
    assert texts(await store.query("t", names=["run"])) == ["event:run"]
    # A message's name is its role.
    assert texts(await store.query("t", names=["user"])) == ["u1", "u2"]
    assert texts(await store.query("t", kinds=["event"], names=["loop.step", "A"])) == [
        "event:loop.step"
    ]
    assert await store.query("t", kinds=["tool_call"]) == []


def at(text: str) -> str:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).isoformat(timespec="microseconds")


@pytest.fixture
async def dated(store):
    stamps = {
        "feb29-late": at("2024-02-29T23:59:59.999999"),
        "mar1-first": at("2024-03-01T00:00:00"),
        "mar1-noon": at("2024-03-01T12:00:00"),
        "mar1-last": at("2024-03-01T23:59:59.999999"),
        "mar2-first": at("2024-03-02T00:00:00"),
        "mar3-noon": at("2024-03-03T12:00:00"),
    }
    entries = [
        TapeEntry("message", {"role": "user", "content": label}, {}, stamp)
        for label, stamp in stamps.items()
    ]
    written = await store.append_many("t", entries)
    assert [e.date for e in written] == list(stamps.values())
    return store


async def test_query_by_bare_dates_covers_whole_utc_days(dated):
    day = await dated.query("t", since="2024-03-01", until="2024-03-01")
    assert texts(day) == ["mar1-first", "mar1-noon", "mar1-last"]
    assert texts(await dated.query("t", since=date(2024, 3, 1), until=date(2024, 3, 2))) == [
        "mar1-first",
        "mar1-noon",
        "mar1-last",
        "mar2-first",
    ]
    assert texts(await dated.query("t", until="2024-02-29")) == ["feb29-late"]
    assert texts(await dated.query("t", since="2024-03-02")) == ["mar2-first", "mar3-noon"]
    assert await dated.query("t", since="2024-03-04") == []


async def test_query_by_datetime_bounds(dated):
    noon = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
    assert texts(await dated.query("t", since=noon, until="2024-03-02T00:00:00Z")) == [
        "mar1-noon",
        "mar1-last",
        "mar2-first",
    ]
    # A naive datetime is read as UTC; an offset is converted to UTC.
    assert texts(await dated.query("t", until=datetime(2024, 3, 1, 0, 0))) == [
        "feb29-late",
        "mar1-first",
    ]
    assert texts(await dated.query("t", since="2024-03-01T13:00:00+01:00", limit=1)) == [
        "mar1-noon"
    ]
    with pytest.raises(ValueError, match="not-a-date"):
        await dated.query("t", since="not-a-date")


async def test_text_search_any_script(store):
    await store.append_many(
        "t",
        [
            msg("plain english Hello"),
            msg("今天天气很好，我们去公园吧"),
            msg("party time 🎉 tonight"),
            msg("Привет, мир"),
            msg('she said "quoted"\nnext line'),
            TapeEntry.tool_result([{"tool_call_id": "c1", "content": "结果：成功 ✅"}]),
        ],
    )

    async def find(needle: str) -> list[int]:
        return [e.id for e in await store.query("t", text=needle)]

    assert await find("天气") == [2]
    assert await find("🎉") == [3]
    assert await find("✅") == [6]
    assert await find("成功") == [6]
    assert await find("Привет") == [4]
    assert await find("hello") == [1]  # ASCII is case-insensitive
    assert await find("HELLO") == [1]
    assert await find('"quoted"\nnext') == [5]
    assert await find("🎈") == []
    assert [e.id for e in await store.query("t", text="🎉", kinds=["tool_result"])] == []


async def test_limit_and_newest_first(store):
    await store.append_many("t", [msg(f"m{i}") for i in range(1, 11)])
    assert texts(await store.query("t", limit=3)) == ["m1", "m2", "m3"]
    assert texts(await store.query("t", newest_first=True, limit=3)) == ["m10", "m9", "m8"]
    assert [e.id for e in await store.query("t", newest_first=True)] == list(range(10, 0, -1))
    assert texts(await store.query("t", after_id=4, before_id=7)) == ["m5", "m6"]
    assert (await store.get("t", 7)).payload["content"] == "m7"
    assert await store.get("t", 11) is None


async def test_tape_query_is_store_query_on_its_name(anchored):
    tape = Tape(anchored, "t")
    assert texts(await tape.query(after_anchor="A")) == ["m4", "anchor:C", "m5"]
    assert texts(await tape.query(between=("B", "A"))) == ["m3"]
    assert texts(await tape.query(kinds=["message"], newest_first=True, limit=2)) == ["m5", "m4"]
    with pytest.raises(AnchorNotFound):
        await tape.query(after_anchor="missing")


# -- ids and transactions ----------------------------------------------------------------------


async def test_dense_ids_under_concurrent_writers(store):
    tapes = [f"tape-{i}" for i in range(10)]

    async def writer(w: int) -> None:
        tape = tapes[w % len(tapes)]
        for i in range(10):
            if i % 3 == 0:
                await store.append_many(tape, [msg(f"w{w}-{i}a"), msg(f"w{w}-{i}b")])
            else:
                await store.append(tape, msg(f"w{w}-{i}"))

    await asyncio.gather(*(writer(w) for w in range(50)))
    for tape in tapes:
        entries = await all_entries(store, tape)
        # 5 writers per tape, each 6 single appends + 4 pairs = 14 entries.
        assert len(entries) == 5 * 14
        assert [e.id for e in entries] == list(range(1, len(entries) + 1))
        assert len(set(texts(entries))) == len(entries)
        assert (await store.stats(tape)).entries == len(entries)


async def test_append_many_is_one_transaction_with_consecutive_ids(store):
    async def batch(b: int) -> list[TapeEntry]:
        return await store.append_many("t", [msg(f"b{b}-{i}") for i in range(5)])

    results = await asyncio.gather(*(batch(b) for b in range(20)))
    for b, written in enumerate(results):
        ids = [e.id for e in written]
        assert ids == list(range(ids[0], ids[0] + 5))
        stored = await store.query("t", after_id=ids[0] - 1, limit=5)
        assert texts(stored) == [f"b{b}-{i}" for i in range(5)]
    assert (await store.stats("t")).entries == 100


@pytest.mark.parametrize(
    "bad",
    [
        TapeEntry("message", {"role": "user", "content": object()}),
        TapeEntry("event", {"name": "x", "data": {1, 2}}),
        TapeEntry("event", {"name": "x", "data": {"n": float("nan")}}),
        TapeEntry("message", {"role": "user", "content": "ok"}, {"blob": b"bytes"}),
    ],
    ids=["object", "set", "nan", "bytes-meta"],
)
async def test_unserialisable_payload_raises_and_writes_nothing(store, bad):
    await store.append_many("t", [msg("before"), TapeEntry.anchor("A")])
    before = await store.stats("t")
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        await store.append_many("t", [msg("fine-1"), msg("fine-2"), bad])
    with pytest.raises(PayloadError):
        await store.append("t", bad)
    with pytest.raises(PayloadError):
        await Tape(store, "t").handoff("h", {"bad": {1, 2}})
    assert await store.stats("t") == before
    assert texts(await all_entries(store, "t")) == ["before", "anchor:A"]
    # The next good append gets the next id: nothing was reserved by the failures.
    assert (await store.append("t", msg("after"))).id == 3


async def test_dedupe_keys(store):
    first = await store.append_many("t", [msg("hello"), msg("again")], dedupe_keys=["k1", "k2"])
    assert [e.id for e in first] == [1, 2]
    assert await store.is_duplicate("k1")
    assert await store.is_duplicate("k2")
    assert not await store.is_duplicate("k3")
    before = await store.stats("t")
    assert await store.append_many("t", [msg("hello")], dedupe_keys=["k1"]) is None
    # Any one known key is enough to refuse the whole group, and the new key is not recorded.
    assert await store.append_many("t", [msg("hello")], dedupe_keys=["k3", "k2"]) is None
    assert not await store.is_duplicate("k3")
    assert await store.stats("t") == before
    assert texts(await all_entries(store, "t")) == ["hello", "again"]
    third = await store.append_many("t", [msg("new")], dedupe_keys=["k3"])
    assert [e.id for e in third] == [3]


async def test_dedupe_keys_survive_reopen(store_url):
    async with await open_store(store_url) as s:
        assert await s.append_many("t", [msg("x")], dedupe_keys=["update:1"]) is not None
    async with await open_store(store_url) as s:
        assert await s.append_many("t", [msg("x")], dedupe_keys=["update:1"]) is None
        assert (await s.stats("t")).entries == 1


async def test_if_no_anchor(store):
    written = await store.append_many("t", [msg("a")], if_no_anchor=True)
    assert [e.id for e in written] == [1]
    await store.append("t", TapeEntry.anchor("A"))
    assert await store.append_many("t", [msg("b")], if_no_anchor=True) is None
    assert (await store.stats("t")).entries == 2


async def test_bootstrap_anchor_written_once_under_concurrency(store):
    tape = Tape(store, "t")
    results = await asyncio.gather(*(tape.ensure_bootstrap_anchor() for _ in range(10)))
    written = [r for r in results if r is not None]
    assert len(written) == 1
    assert written[0].id == 1
    anchors = await tape.query(kinds=["anchor"])
    assert len(anchors) == 1
    assert anchors[0].payload == {"name": BOOTSTRAP_ANCHOR, "state": {"owner": "human"}}
    assert await tape.ensure_bootstrap_anchor() is None
    assert (await store.stats("t")).entries == 1


async def test_bootstrap_anchor_not_written_when_tape_has_an_anchor(store):
    tape = Tape(store, "t")
    await tape.append_message({"role": "user", "content": "hi"})
    await tape.handoff("phase-2")
    assert await tape.ensure_bootstrap_anchor() is None
    assert [a.name for a in await tape.anchors()] == ["phase-2"]


# -- info and anchors ---------------------------------------------------------------------------


async def test_info_counts(store):
    tape = Tape(store, "t")
    empty = await tape.info()
    assert (empty.entries, empty.anchors, empty.last_anchor, empty.entries_since_anchor) == (
        0,
        0,
        None,
        0,
    )
    assert empty.last_usage is None

    await tape.ensure_bootstrap_anchor()
    await tape.append_message({"role": "user", "content": "q"})
    await tape.append_event("run", {"usage": {"total_tokens": 10}})
    await tape.append_event("loop.step", {"usage": {"total_tokens": 999}})
    await tape.handoff("phase-2", {"summary": "s"})
    await tape.append_message({"role": "user", "content": "q2"})
    await tape.append_event("run", {"usage": {"total_tokens": 42, "prompt_tokens": 40}})
    await tape.append_event("run", {"status": "no usage recorded here"}, context=False)
    await tape.append_error("x", "y")
    info = await tape.info()
    # 1 bootstrap + q + run + loop.step + (anchor + handoff event) + q2 + run + run + error
    assert info.entries == 10
    assert info.anchors == 2
    assert info.last_anchor == "phase-2"
    assert info.entries_since_anchor == 5
    # The newest run event has no usage: info reports what that event says.
    assert info.last_usage is None
    await tape.append_event("run", {"usage": {"total_tokens": 7}})
    assert (await tape.info()).last_usage == {"total_tokens": 7}


async def test_info_last_usage_from_newest_run(store):
    tape = Tape(store, "t")
    await tape.append_event("run", {"usage": {"total_tokens": 1}})
    await tape.append_event("run", {"usage": {"total_tokens": 2}})
    await tape.append_event("other", {"usage": {"total_tokens": 3}})
    info = await tape.info()
    assert info.last_usage == {"total_tokens": 2}
    assert info.anchors == 0 and info.last_anchor is None and info.entries_since_anchor == 3


async def test_anchors_limit_keeps_newest_oldest_first(store):
    tape = Tape(store, "t")
    for i in range(30):
        await tape.append_many([TapeEntry.anchor(f"a{i}", {"i": i}), msg(f"m{i}")])
    default = await tape.anchors()
    assert [a.name for a in default] == [f"a{i}" for i in range(10, 30)]
    assert [a.name for a in await tape.anchors(limit=3)] == ["a27", "a28", "a29"]
    assert (await tape.anchors(limit=1))[0].payload["state"] == {"i": 29}


# -- reset and archive --------------------------------------------------------------------------


async def test_reset_archives_tape_and_sidecar(store):
    tape = Tape(store, "t", session_id="cli:local")
    other = Tape(store, "other")
    await tape.ensure_bootstrap_anchor()
    await tape.append_message({"role": "user", "content": "before reset"})
    await tape.sidecar("spill").append(TapeEntry.anchor("spill/h/chunk/0"))
    await tape.sidecar("spill").append(
        TapeEntry.tool_result([{"tool_call_id": "c", "content": "x"}])
    )
    await other.append_message({"role": "user", "content": "unrelated"})
    old = await all_entries(store, "t")
    old_side = await all_entries(store, sidecar_name("t", "spill"))

    archived = await tape.reset(archive=True)
    assert archived and archived != "t" and archived.startswith("t")

    # Everything moved, with its ids, under the archive name.
    assert await all_entries(store, archived) == old
    assert await all_entries(store, sidecar_name(archived, "spill")) == old_side
    assert await all_entries(store, sidecar_name("t", "spill")) == []

    fresh = await all_entries(store, "t")
    # The fresh tape: its anchor, then what happened to the sidecar (context=False events).
    assert [e.kind for e in fresh] == ["anchor", "event", "event"]
    assert [e.name for e in fresh[1:]] == ["sidecar.archive", "sidecar.reset"]
    assert fresh[0].id == 1
    assert fresh[0].payload == {
        "name": BOOTSTRAP_ANCHOR,
        "state": {"owner": "human", "archived": archived},
    }
    info = await tape.info()
    assert (info.entries, info.anchors, info.last_anchor) == (3, 1, BOOTSTRAP_ANCHOR)
    assert await tape.read_messages() == []
    assert await tape.ensure_bootstrap_anchor() is None

    # Other tapes are untouched; list_tapes shows live tapes only.
    assert texts(await all_entries(store, "other")) == ["unrelated"]
    live = await store.list_tapes()
    assert sorted(t.name for t in live) == ["other", "t"]
    assert next(t for t in live if t.name == "t").session_id == "cli:local"
    every = {t.name for t in await store.list_tapes(include_all=True)}
    assert every == {"t", "other", archived, sidecar_name(archived, "spill")}

    # A second reset gets another archive and keeps the first.
    await tape.append_message({"role": "user", "content": "phase two"})
    second = await tape.reset()
    assert second != archived
    assert texts(await all_entries(store, second)) == [
        "anchor:session/start",
        "event:sidecar.archive",
        "event:sidecar.reset",
        "phase two",
    ]
    assert await all_entries(store, archived) == old
    assert sorted(t.name for t in await store.list_tapes()) == ["other", "t"]


async def test_reset_carry_rewrites_entries_after_anchor(store):
    tape = Tape(store, "t")
    await tape.ensure_bootstrap_anchor()
    await tape.append_message({"role": "user", "content": "old"})
    late = TapeEntry.message({"role": "user", "content": "arrived during /reset"}, via="slack")
    archived = await tape.reset(carry=[late])
    fresh = await all_entries(store, "t")
    assert [e.id for e in fresh] == [1, 2]
    assert fresh[0].name == BOOTSTRAP_ANCHOR
    assert fresh[1].payload == late.payload
    assert fresh[1].meta == {"via": "slack"}
    assert fresh[1].date == late.date
    assert await tape.read_messages() == [late.payload]
    assert texts(await all_entries(store, archived)) == ["anchor:session/start", "old"]


async def test_reset_without_archive_deletes(store):
    tape = Tape(store, "t")
    await tape.ensure_bootstrap_anchor()
    await tape.append_message({"role": "user", "content": "gone"})
    await tape.sidecar("spill").append(msg("gone too"))
    assert await tape.reset(archive=False) is None
    fresh = await all_entries(store, "t")
    assert texts(fresh) == ["anchor:session/start", "event:sidecar.reset"]
    assert fresh[0].payload == {"name": BOOTSTRAP_ANCHOR, "state": {"owner": "human"}}
    assert await all_entries(store, sidecar_name("t", "spill")) == []
    names = {t.name for t in await store.list_tapes(include_all=True)}
    assert names == {"t"}
    assert await stored_rows(store) == 2


async def stored_rows(store: TapeStore) -> int:
    """Entry rows in the whole database, read around the store."""
    if store.kind == "sqlite":
        raw = sqlite3.connect(store.path)  # type: ignore[attr-defined]
        try:
            return raw.execute("SELECT count(*) FROM entries").fetchone()[0]
        finally:
            raw.close()
    async with store.pool.acquire() as conn:  # type: ignore[attr-defined]
        return await conn.fetchval("SELECT count(*) FROM bub_entries")


async def test_store_archive_leaves_empty_live_tape(store):
    await store.append_many("t", [msg("a"), msg("b")])
    archived = await store.archive("t")
    assert texts(await all_entries(store, archived)) == ["a", "b"]
    assert await all_entries(store, "t") == []
    assert (await store.append("t", msg("c"))).id == 1


async def test_reset_carries_inbound_messages_after_an_id(store):
    tape = Tape(store, "t", session_id="s")
    await tape.ensure_bootstrap_anchor()
    command = await tape.append(msg("/reset", inbound=True))
    await tape.append_many(
        [
            msg("queued 1", inbound=True),
            TapeEntry.event("loop.step", {"inbound": True}),  # payload, not meta
            msg("reply", role="assistant"),
            msg("queued 2", inbound=1, via="slack"),
            msg("not inbound", inbound=False),
        ]
    )
    archived = await tape.reset(carry_inbound_after=command.id)
    fresh = await all_entries(store, "t")
    assert texts(fresh) == ["anchor:session/start", "queued 1", "queued 2"]
    assert [e.id for e in fresh] == [1, 2, 3]
    assert fresh[2].meta == {"inbound": 1, "via": "slack"}
    assert len(await all_entries(store, archived)) == 7


async def test_reset_family_is_the_tape_and_its_sidecars_only(store):
    # Names with LIKE wildcards: only the exact tape and `<tape>__sidecar__*` move.
    for name in ("a_%", "a_%__sidecar__spill", "ab%", "aX%__sidecar__spill", "a_%x"):
        await store.append(name, msg(name))
    archived = await store.archive("a_%")
    names = {t.name for t in await store.list_tapes(include_all=True)}
    assert names == {
        "a_%",
        archived,
        sidecar_name(archived, "spill"),
        "ab%",
        "aX%__sidecar__spill",
        "a_%x",
    }


async def test_lone_surrogates_and_nul_are_stored_safely(store):
    odd = "caf\udce9 \ud83d alone, nul \x00 here"
    written = await store.append_many(
        "t",
        [
            TapeEntry.message({"role": "user", "content": odd}, path=odd),
            TapeEntry.event(odd, {"x": odd}),
            TapeEntry.anchor(f"a{odd}", {"s": odd}),
            msg("after 🎉"),
        ],
        dedupe_keys=[f"key {odd}"],
        session_id=f"s{odd}",
    )
    assert written is not None
    back = await all_entries(store, "t")
    assert back == written  # payload, meta and dates exactly
    assert back[0].payload["content"] == odd and back[0].meta == {"path": odd}
    assert texts(await store.query("t", after_anchor=f"a{odd}")) == ["after 🎉"]
    assert [e.id for e in await store.query("t", names=[odd])] == [2]
    assert [e.id for e in await store.query("t", text="alone, NUL")] == [1, 2, 3]
    assert await store.is_duplicate(f"key {odd}")
    assert await store.append_many("t", [msg("again")], dedupe_keys=[f"key {odd}"]) is None
    (listed,) = await store.list_tapes()
    assert listed.session_id is not None and listed.session_id.startswith("s")


async def test_session_tapes_are_the_live_tapes_of_a_session(store):
    await store.append("ws1__s", msg("a"))  # no session id recorded
    for name in ("ws1__s", "ws2__s", "ws1__other"):
        session = "other" if name.endswith("other") else "telegram:1\x00"
        await store.append_many(name, [msg(name)], session_id=session)
    await store.append_many(
        sidecar_name("ws1__s", "spill"), [msg("x")], session_id="telegram:1\x00"
    )
    await store.archive("ws2__s")  # the live tape stays (empty), the archive is not live
    assert await store.session_tapes("telegram:1\x00") == ["ws1__s", "ws2__s"]
    assert await store.session_tapes("nobody") == []


async def test_ping_and_probe_leave_nothing_behind(store):
    await store.ping()
    await store.probe()
    assert await store.list_tapes(include_all=True) == []
    assert await store.dedupe_records() == []


# -- copying between stores (the primitives `tapes copy` uses) ----------------------------------


async def test_append_copies_keeps_ids_dates_and_meta(store):
    source = [
        TapeEntry(
            "message",
            {"role": "user", "content": "老 🎉"},
            {"inbound": True},
            at("2023-01-02T03:04:05"),
            1,
        ),
        TapeEntry("anchor", {"name": "A", "state": {}}, {}, at("2023-01-02T03:04:06"), 2),
        TapeEntry("event", {"name": "run", "data": {}}, {"context": False}, "2023-01-02", 3),
    ]
    assert await store.append_copies("t", source[:2], session_id="s", updated="2023-01-03") == 2
    assert await store.append_copies("t", source[2:]) == 1
    assert await all_entries(store, "t") == source
    assert await store.stats("t") == TapeStats("t", "s", 3, 1, 2)
    # Ids must continue the tape without gaps; a bad batch writes nothing.
    gap = TapeEntry("message", {"role": "user", "content": "x"}, {}, "2023", 5)
    with pytest.raises(TapeStoreError, match="continue at id 4"):
        await store.append_copies("t", [gap])
    with pytest.raises(TapeStoreError):
        await store.append_copies("t", source[:1])
    assert (await store.stats("t")).entries == 3
    # An empty copy creates the tape with its activity time (an archived, empty live tape).
    assert await store.append_copies("empty", [], session_id="s2", updated="2022-05-05") == 0
    summary = next(t for t in await store.list_tapes() if t.name == "empty")
    assert (summary.session_id, summary.entries, summary.updated) == ("s2", 0, "2022-05-05")


async def test_dedupe_records_page_in_key_order_and_add_only_new(store):
    await store.append_many("t", [msg("a")], dedupe_keys=["k:b", "k:a"])
    await store.append_many("u", [msg("b"), msg("c")], dedupe_keys=["k:é", "k:c"])
    records = await store.dedupe_records()
    assert [r.key for r in records] == ["k:a", "k:b", "k:c", "k:é"]  # byte order
    assert {(r.key, r.tape, r.entry_id) for r in records} == {
        ("k:a", "t", 1),
        ("k:b", "t", 1),
        ("k:c", "u", 1),
        ("k:é", "u", 1),
    }
    assert [r.key for r in await store.dedupe_records(after="k:b", limit=1)] == ["k:c"]
    copied = [DedupeRecord("k:new", "x", 3, "2024-01-01"), records[0]]
    assert await store.add_dedupe_records(copied) == 1
    assert await store.add_dedupe_records(copied) == 0
    assert await store.is_duplicate("k:new")


# -- opening ------------------------------------------------------------------------------------


async def test_open_creates_missing_directory(tmp_path):
    path = tmp_path / "deep" / "er" / "tapes.db"
    async with await SQLiteTapeStore.open(path) as s:
        await s.append("t", msg("x"))
    assert path.is_file()


async def test_open_is_usable_as_async_context_manager(tmp_path):
    path = tmp_path / "ctx.db"
    async with SQLiteTapeStore.open(path) as s:
        await s.append("t", msg("x"))
    # Closed on exit: the connection no longer runs statements.
    with pytest.raises(ValueError):
        await s.stats("t")
    async with await SQLiteTapeStore.open(path) as s:
        assert (await s.stats("t")).entries == 1


async def test_open_reopens_existing_data(tmp_path):
    path = tmp_path / "tapes.db"
    async with await SQLiteTapeStore.open(path) as s:
        await s.append_many("t", [msg("a"), TapeEntry.anchor("A"), msg("b")])
    async with await SQLiteTapeStore.open(path) as s:
        assert texts(await s.query("t", after_last_anchor=True)) == ["b"]
        assert (await s.append("t", msg("c"))).id == 4
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()


async def open_error(path) -> TapeStoreError:
    """The TapeStoreError opening `path` raises (closing the store if it opened after all)."""
    try:
        opened = await SQLiteTapeStore.open(path)
    except TapeStoreError as exc:
        return exc
    await opened.close()
    raise AssertionError(f"opening {path} should have failed")


def assert_one_line_naming(exc: TapeStoreError, path, *causes: str) -> None:
    text = str(exc)
    assert "\n" not in text
    assert str(path) in text
    assert any(c in text.lower() for c in causes), text


async def test_open_under_a_regular_file_fails_clearly(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("I am a file, not a directory")
    path = afile / "db.sqlite"
    error = await open_error(path)
    assert_one_line_naming(error, path, "exists", "not a directory")
    assert afile.read_text() == "I am a file, not a directory"


async def test_open_in_unwritable_directory_fails_clearly(tmp_path):
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Root ignores directory permissions (CI runs as root): a directory nobody may create
        # files in, whoever they are, stands in for the locked one.
        path = Path("/proc/self/tapes.db")
        error = await open_error(path)
        assert_one_line_naming(error, path, "unable to open", "readonly", "permission")
        return
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        path = locked / "tapes.db"
        error = await open_error(path)
        assert_one_line_naming(error, path, "unable to open", "readonly", "permission")
    finally:
        locked.chmod(0o700)


async def test_open_non_sqlite_file_fails_clearly_and_changes_nothing(tmp_path):
    path = tmp_path / "notes.db"
    garbage = b"this is a text file, certainly not SQLite\n" * 200
    path.write_bytes(garbage)
    error = await open_error(path)
    assert_one_line_naming(error, path, "not a database")
    assert path.read_bytes() == garbage


@pytest.mark.parametrize("where", [(0, 16), (100, 4096)], ids=["header", "schema-page"])
async def test_open_corrupt_sqlite_file_fails_clearly(tmp_path, where):
    path = tmp_path / "tapes.db"
    async with await SQLiteTapeStore.open(path) as s:
        await s.append_many("t", [msg("x" * 200) for _ in range(100)])
    data = bytearray(path.read_bytes())
    lo, hi = where
    data[lo:hi] = b"\xa5" * (hi - lo)
    path.write_bytes(bytes(data))
    error = await open_error(path)
    assert_one_line_naming(error, path, "not a database", "malformed", "corrupt")


async def test_open_newer_schema_fails_clearly(tmp_path):
    path = tmp_path / "future.db"
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.execute("CREATE TABLE future (x)")
    raw.commit()
    raw.close()
    error = await open_error(path)
    assert_one_line_naming(error, path, "newer")
    assert f"schema version {SCHEMA_VERSION + 1}" in str(error)
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {"future"}
    finally:
        raw.close()


async def test_open_upgrades_an_older_file_in_one_step(tmp_path):
    """The next release adds MIGRATIONS[n+1]: opening an existing file runs it once, keeps the
    data, and this release then refuses the upgraded file."""
    path = tmp_path / "old.db"
    async with await SQLiteTapeStore.open(path) as s:
        await s.append_many("t", [msg("kept"), TapeEntry.anchor("A")])
    nxt = SCHEMA_VERSION + 1
    upgrade = {**MIGRATIONS, nxt: "CREATE TABLE upgrade_probe (tape INTEGER PRIMARY KEY)"}
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        migrate(raw, upgrade, nxt)
        migrate(raw, upgrade, nxt)  # already there: nothing runs twice
        assert raw.execute("PRAGMA user_version").fetchone()[0] == nxt
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"tapes", "entries", "dedupe", "upgrade_probe"} <= tables
        assert raw.execute("SELECT count(*) FROM entries").fetchone()[0] == 2
    finally:
        raw.close()
    error = await open_error(path)
    assert_one_line_naming(error, path, f"schema version {nxt} is newer")


async def test_reset_of_a_tape_never_written_archives_nothing(store):
    tape = Tape(store, "never", session_id="cli:never")
    assert await tape.reset(archive=True) is None
    [start] = await tape.query()
    assert start.payload == {"name": "session/start", "state": {"owner": "human"}}
    assert [t.name for t in await store.list_tapes(include_all=True)] == ["never"]
    with pytest.raises(TapeStoreError, match="nothing to archive"):
        await store.archive("not-there")


async def test_reset_does_not_carry_copies_made_after_an_anchor(store):
    """Older tapes marked copies inbound too: a copy was answered and is never carried."""
    tape = Tape(store, "t", session_id="cli:local")
    await tape.ensure_bootstrap_anchor()
    original = await tape.append(
        TapeEntry.message({"role": "user", "content": "secret"}, inbound=True, channel="c")
    )
    command = await tape.append(TapeEntry.event("command", {"name": "reset"}, inbound=True))
    await tape.append(
        TapeEntry.message({"role": "user", "content": "secret"}, inbound=True, copy_of=original.id)
    )
    await tape.append(
        TapeEntry.message({"role": "user", "content": "queued"}, inbound=True, channel="c")
    )
    await tape.reset(archive=True, carry_inbound_after=command.id)
    users = [e.payload["content"] for e in await tape.query(kinds=["message"])]
    assert users == ["queued"]
