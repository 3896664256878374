"""Fork, merge and discard on both stores (SQLite file and PostgreSQL): what a fork reads,
merge ids dense and atomic under concurrent appends, sidecars, and reset/archive events."""

from __future__ import annotations

import asyncio

import pytest

from bub_bot.tape import (
    ForkError,
    Tape,
    TapeEntry,
    TapeStore,
    fork,
    open_fork,
    sidecar_name,
)


@pytest.fixture
def store(any_store: TapeStore) -> TapeStore:
    return any_store


def msg(text: str, role: str = "user", **meta) -> TapeEntry:
    return TapeEntry.message({"role": role, "content": text}, **meta)


def contents(entries: list[TapeEntry]) -> list[str]:
    return [e.payload.get("content", f"{e.kind}:{e.name}") for e in entries]


async def test_fork_reads_parent_to_fork_point_then_its_own(store) -> None:
    tape = Tape(store, "t", "s1")
    await tape.append_many([TapeEntry.anchor("A"), msg("p1"), msg("p2")])
    child = await fork(tape)
    assert child.name.startswith("t__fork__") and child.base == 3
    await tape.append(msg("parent-later"))
    written = await child.append_many([msg("c1"), msg("c2", role="assistant", turn="x")])
    assert [e.id for e in written] == [4, 5]
    assert contents(await child.query()) == ["anchor:A", "p1", "p2", "c1", "c2"]
    assert [e.id for e in await child.query()] == [1, 2, 3, 4, 5]
    assert contents(await child.query(after_last_anchor=True)) == ["p1", "p2", "c1", "c2"]
    assert contents(await child.query(limit=2)) == ["anchor:A", "p1"]
    assert contents(await child.query(newest_first=True, limit=3)) == ["c2", "c1", "p2"]
    assert contents(await child.query(after_id=3)) == ["c1", "c2"]
    assert contents(await child.query(after_anchor="A")) == ["p1", "p2", "c1", "c2"]
    assert [m["content"] for m in await child.read_messages()] == ["p1", "p2", "c1", "c2"]
    # The parent never sees the fork's entries, the fork never the parent's later ones.
    assert contents(await tape.query()) == ["anchor:A", "p1", "p2", "parent-later"]
    # An anchor on the fork starts its default view.
    await child.append(TapeEntry.anchor("B"))
    await child.append(msg("c3"))
    assert contents(await child.query(after_last_anchor=True)) == ["c3"]
    assert await store.forks("t") == [child.name]
    assert child.name not in [t.name for t in await store.list_tapes()]


async def test_merge_appends_after_parent_dense_and_records_it(store) -> None:
    tape = Tape(store, "t", "s1")
    await tape.append_many([TapeEntry.anchor("A"), msg("p1")])
    child = await fork(tape)
    await child.append_many([msg("c1"), msg("c2", role="assistant", turn="x")])
    await tape.append(msg("p2"))
    merged = await child.merge()
    assert (merged.first, merged.last, merged.entries) == (4, 5, 2)
    entries = await tape.query()
    assert [e.id for e in entries] == list(range(1, len(entries) + 1))
    assert contents(entries[:5]) == ["anchor:A", "p1", "p2", "c1", "c2"]
    assert entries[4].meta == {"turn": "x"} and entries[4].payload["role"] == "assistant"
    event = entries[5]
    assert event.name == "fork.merge" and event.meta == {"context": False}
    assert event.payload["data"] == {
        "fork": child.name,
        "base": 2,
        "entries": 2,
        "first_id": 4,
        "last_id": 5,
    }
    assert await store.fork_point(child.name) is None
    assert await store.forks("t") == []
    with pytest.raises(ForkError):
        await child.merge()
    with pytest.raises(ForkError):
        await open_fork(store, child.name)


async def test_merge_is_atomic_under_concurrent_appends(store) -> None:
    tape = Tape(store, "t", "s1")
    await tape.append(TapeEntry.anchor("A"))
    child = await fork(tape)
    await child.append_many([msg(f"c{i}") for i in range(200)])

    async def writer() -> None:
        for i in range(30):
            await tape.append(msg(f"p{i}"))

    await asyncio.gather(writer(), child.merge(), writer())
    entries = await tape.query()
    assert [e.id for e in entries] == list(range(1, len(entries) + 1))
    merged = [e.payload.get("content") for e in entries if str(e.payload.get("content"))[:1] == "c"]
    assert merged == [f"c{i}" for i in range(200)]
    # The merged range is contiguous: no parent append landed inside it.
    ids = [e.id for e in entries if str(e.payload.get("content"))[:1] == "c"]
    assert ids == list(range(ids[0], ids[0] + 200))
    assert len(entries) == 1 + 60 + 200 + 1


async def test_discard_drops_or_archives(store) -> None:
    tape = Tape(store, "t", "s1")
    await tape.append(msg("p1"))
    child = await fork(tape)
    await child.append(msg("c1"))
    await child.sidecar("spill").append(msg("chunk"))
    assert await child.discard() is None
    assert await store.fork_point(child.name) is None
    assert await store.query(child.name) == []
    assert await store.query(sidecar_name(child.name, "spill")) == []
    assert contents(await tape.query()) == ["p1"]
    kept = await fork(tape)
    await kept.append(msg("c2"))
    archived = await kept.discard(archive=True)
    assert archived and "__archive__" in archived
    assert contents(await store.query(archived)) == ["c2"]
    assert await kept.discard() is None  # gone already: nothing to do
    assert contents(await tape.query()) == ["p1"]


async def test_sidecars_fork_and_merge_with_their_tape(store) -> None:
    tape = Tape(store, "t", "s1")
    await tape.append(msg("p1"))
    await tape.sidecar("spill").append_many([TapeEntry.anchor("spill/old/manifest")])
    child = await fork(tape)
    side = child.sidecar("spill")
    # The fork's sidecar reads the parent's (old handles stay readable) plus its own.
    await side.append_many([TapeEntry.anchor("spill/new/manifest"), msg("chunk")])
    assert contents(await side.query()) == [
        "anchor:spill/old/manifest",
        "anchor:spill/new/manifest",
        "chunk",
    ]
    assert contents(await side.query(after_anchor="spill/old/manifest", limit=1)) == [
        "anchor:spill/new/manifest"
    ]
    # A sidecar first written on the fork goes to a new parent sidecar on merge.
    await child.sidecar("notes").append(msg("note"))
    await child.append(msg("c1"))
    merged = await child.merge()
    assert merged.sidecars == {"spill": 2, "notes": 1}
    spill = await tape.sidecar("spill").query()
    assert contents(spill) == ["anchor:spill/old/manifest", "anchor:spill/new/manifest", "chunk"]
    assert [e.id for e in spill] == [1, 2, 3]
    assert contents(await tape.sidecar("notes").query()) == ["note"]
    events = await tape.query(kinds=["event"], names=["sidecar.merge"])
    assert [(e.payload["data"]["sidecar"], e.payload["data"]["entries"]) for e in events] == [
        ("notes", 1),
        ("spill", 2),
    ]
    assert all(e.meta == {"context": False} for e in events)
    assert events[1].payload["data"]["to"] == sidecar_name("t", "spill")


async def test_reset_and_archive_record_sidecar_events(store) -> None:
    tape = Tape(store, "t", "s1")
    await tape.append(msg("p1"))
    await tape.sidecar("spill").append(msg("chunk"))
    archived = await tape.reset()
    assert archived
    entries = await tape.query()
    assert [e.kind for e in entries] == ["anchor", "event", "event"]
    archive_event, reset_event = entries[1], entries[2]
    assert archive_event.name == "sidecar.archive" and reset_event.name == "sidecar.reset"
    assert archive_event.payload["data"] == {
        "sidecar": "spill",
        "tape": sidecar_name("t", "spill"),
        "archived": sidecar_name(archived, "spill"),
    }
    assert all(e.meta == {"context": False} for e in entries[1:])
    assert await tape.read_messages() == []
    assert contents(await store.query(sidecar_name(archived, "spill"))) == ["chunk"]
    # Without archiving: only the reset event; no sidecar left: none.
    await tape.sidecar("spill").append(msg("chunk2"))
    assert await tape.reset(archive=False) is None
    assert [e.name for e in await tape.query()] == ["session/start", "sidecar.reset"]
    await tape.reset(archive=False)
    assert [e.name for e in await tape.query()] == ["session/start"]


async def test_fork_survives_reopening(store_url, tmp_path) -> None:
    from bub_bot.tape import open_store

    async with open_store(store_url) as first:
        tape = Tape(first, "t", "s1")
        await tape.append(msg("p1"))
        child = await fork(tape, tag="crash")
        await child.append(msg("c1"))
    async with open_store(store_url) as second:
        again = await open_fork(second, child.name)
        assert again.base == 1 and again.parent == "t"
        assert contents(await again.query()) == ["p1", "c1"]
        await again.append(msg("c2"))
        assert [e.id for e in await again.query()] == [1, 2, 3]


async def test_discard_whole_archives_a_live_tape_without_a_fresh_one(store) -> None:
    tape = Tape(store, "temp", "s1/temp/x")
    await tape.append(msg("work"))
    await tape.sidecar("spill").append(msg("chunk"))
    assert await store.discard("temp", archive=True) is None  # not a fork: refused
    archived = await store.discard("temp", archive=True, whole=True)
    assert archived and contents(await store.query(archived)) == ["work"]
    assert contents(await store.query(sidecar_name(archived, "spill"))) == ["chunk"]
    names = {t.name for t in await store.list_tapes(include_all=True)}
    assert "temp" not in names and sidecar_name("temp", "spill") not in names


async def test_tapes_copy_carries_archived_forks(store, tmp_path) -> None:
    from bub_bot.tape import open_store
    from bub_bot.tape.copy import copy_tapes

    tape = Tape(store, "t", "s1")
    await tape.append_many([msg("p1"), msg("p2")])
    child = await fork(tape)
    await child.append_many([msg("c1"), msg("c2")])
    archived = await child.discard(archive=True)
    async with open_store(f"sqlite:///{tmp_path / 'copy.db'}") as other:
        report = await copy_tapes(store, other)
        assert report.failed == []
        assert [e.id for e in await other.query(archived)] == [3, 4]
        assert (await other.stats(archived)).entries == 4
        again = await copy_tapes(store, other)
        assert again.failed == [] and again.entries == 0
