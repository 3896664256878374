"""`bub-bot tapes copy`: SQLite -> PostgreSQL -> a new SQLite file gives identical exports; a
second run copies nothing; a destination holding other data under a name is left alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bub_bot.__main__ import main
from bub_bot.tape import DedupeRecord, Tape, TapeEntry, open_store

WORKSPACE = "/srv/bub-workspace"


def run(monkeypatch, capsys, database: str, *args: str) -> tuple[int, str, str]:
    """`bub-bot <args>` in this process with BUB_DATABASE_URL=database."""
    monkeypatch.setenv("BUB_DATABASE_URL", database)
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no .env from the checkout
    monkeypatch.setenv("BUB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BUB_WORKSPACE", WORKSPACE)


def user(text: str, **meta) -> TapeEntry:
    return TapeEntry.message({"role": "user", "content": text}, inbound=True, **meta)


async def build_source(url: str) -> None:
    """Two sessions with archives, spill sidecars, CJK/emoji/surrogate text, dedupe keys, a
    long tape (several copy batches) and an empty live tape."""
    async with open_store(url) as store:
        chat = Tape.for_session(store, "telegram:42", WORKSPACE)
        spill = chat.sidecar("spill")
        await chat.append_many([user("你好，帮我看看这个文件 🎉")], bootstrap=True)
        await store.append_many(
            chat.name, [user("second delivery 🚀")], dedupe_keys=["telegram:update:1001"]
        )
        await chat.append_many(
            [
                TapeEntry.tool_call(
                    [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "fs_read", "arguments": "{}"},
                        }
                    ]
                ),
                TapeEntry.tool_result([{"tool_call_id": "c1", "content": "结果：成功 ✅"}]),
                TapeEntry.message({"role": "assistant", "content": "Готово — done 👍"}),
                TapeEntry.event("spill.write", {"handle": "h1"}, context=False),
                TapeEntry.message({"role": "user", "content": "bad bytes \udcff here"}),
            ]
        )
        await spill.append_many(
            [
                TapeEntry.anchor("spill/h1/chunk/0"),
                TapeEntry.tool_result([{"tool_call_id": "c1", "content": "大" * 5000}]),
                TapeEntry.anchor("spill/h1/manifest", {"chunks": 1}),
            ]
        )
        await chat.handoff("handoff", {"summary": "第一阶段 done", "owner": "human"})
        await chat.reset()  # the tape and its sidecar go to an archive
        await store.append_many(
            chat.name, [user("after the reset ✨")], dedupe_keys=["telegram:update:1002"]
        )
        await spill.append(TapeEntry.anchor("spill/h2/chunk/0"))

        thread = Tape.for_session(store, "slack:T1:C1:1700000000.000100", WORKSPACE)
        await thread.append_many([user(f"line {i} 🧵") for i in range(2500)], bootstrap=True)
        await thread.append_event("run", {"usage": {"total_tokens": 7}})

        dm = Tape.for_session(store, "slack:T1:D9", WORKSPACE)
        await dm.append_many([user("short-lived")], bootstrap=True)
        await store.archive(dm.name)  # the live tape stays, empty


async def names_of(url: str) -> list[str]:
    async with open_store(url) as store:
        return sorted(t.name for t in await store.list_tapes(include_all=True))


async def dedupe_of(url: str) -> list[DedupeRecord]:
    async with open_store(url) as store:
        return await store.dedupe_records(limit=100_000)


def snapshot(monkeypatch, capsys, url: str) -> dict[str, str]:
    """`tapes list --all` and `tapes export` of every tape, as printed."""
    code, listed, err = run(monkeypatch, capsys, url, "tapes", "list", "--all")
    assert code == 0, err
    out = {"list": listed}
    for name in asyncio.run(names_of(url)):
        code, exported, err = run(monkeypatch, capsys, url, "tapes", "export", name)
        assert code == 0, err
        out[name] = exported
    return out


def test_copy_sqlite_to_postgres_and_back(monkeypatch, capsys, tmp_path, pg_url) -> None:
    source = f"sqlite:///{tmp_path / 'source.db'}"
    back = f"sqlite:///{tmp_path / 'back' / 'copy.db'}"
    asyncio.run(build_source(source))
    before = snapshot(monkeypatch, capsys, source)
    tapes = len(before) - 1
    assert tapes == 7  # 3 live, 2 archives, 1 live sidecar, 1 archived sidecar
    assert any("你好" in text and "\\udcff" in text for text in before.values())

    code, out, err = run(monkeypatch, capsys, source, "tapes", "copy", "--to", pg_url)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("copying tapes from ") and "postgresql://bub@127.0.0.1" in lines[0]
    assert "pg-test-secret" not in out
    progress = [line for line in lines if line.startswith("[")]
    assert len(progress) == tapes and all(line.endswith(", verified") for line in progress)
    assert any("2,502 entries, 2,502 copied" in line for line in progress)
    assert lines[-1].startswith(f"{tapes} tapes, 2,522 entries and 2 dedupe keys copied")

    # A second run finds everything there and copies nothing.
    code, out, err = run(monkeypatch, capsys, source, "tapes", "copy", "--to", pg_url)
    assert code == 0, err
    progress = [line for line in out.splitlines() if line.startswith("[")]
    assert len(progress) == tapes and all("up to date" in line for line in progress)
    assert out.splitlines()[-1].startswith(f"{tapes} tapes, 0 entries and 0 dedupe keys copied")

    # PostgreSQL -> a new SQLite file, --from given explicitly.
    code, out, err = run(
        monkeypatch, capsys, source, "tapes", "copy", "--from", pg_url, "--to", back
    )
    assert code == 0, err
    assert snapshot(monkeypatch, capsys, pg_url) == before
    assert snapshot(monkeypatch, capsys, back) == before
    keys = [(r.key, r.tape, r.entry_id) for r in asyncio.run(dedupe_of(source))]
    assert [(r.key, r.tape, r.entry_id) for r in asyncio.run(dedupe_of(pg_url))] == keys
    assert [(r.key, r.tape, r.entry_id) for r in asyncio.run(dedupe_of(back))] == keys


async def conflicting(url: str, name: str) -> None:
    async with open_store(url) as store:
        await store.append(name, TapeEntry.message({"role": "user", "content": "other data"}))


async def entries_of(url: str, name: str) -> list[TapeEntry]:
    async with open_store(url) as store:
        return await store.query(name)


def test_copy_leaves_a_conflicting_tape_alone(monkeypatch, capsys, tmp_path, pg_url) -> None:
    source = f"sqlite:///{tmp_path / 'source.db'}"
    asyncio.run(build_source(source))
    victim = asyncio.run(names_of(source))[0]
    asyncio.run(conflicting(pg_url, victim))
    code, out, err = run(monkeypatch, capsys, source, "tapes", "copy", "--to", pg_url)
    assert code == 1
    assert f"{victim}: FAILED, entry 1 differs" in out
    assert victim in err and err.count("\n") == 1
    assert [e.payload["content"] for e in asyncio.run(entries_of(pg_url, victim))] == ["other data"]
    copied = [line for line in out.splitlines() if line.endswith(", verified")]
    assert len(copied) == 6  # every other tape was copied


def test_copy_arguments(monkeypatch, capsys, tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'same.db'}"
    code, _, err = run(monkeypatch, capsys, db, "tapes", "copy", "--to", str(tmp_path / "same.db"))
    assert code == 2 and "same database" in err
    with pytest.raises(SystemExit) as exited:
        run(monkeypatch, capsys, db, "tapes", "copy", "--to", "mysql://u:SECRETpw@h/x")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and "'mysql'" in err and "SECRETpw" not in err
    with pytest.raises(SystemExit):
        run(monkeypatch, capsys, db, "tapes", "copy")  # --to is required
    assert "--to" in capsys.readouterr().err


async def copy_first(source: str, destination: str, name: str, count: int) -> None:
    async with open_store(source) as src, open_store(destination) as dst:
        await dst.append_copies(name, await src.query(name, limit=count))


def test_interrupted_copy_continues_where_it_stopped(monkeypatch, capsys, tmp_path, pg_url):
    source = f"sqlite:///{tmp_path / 'source.db'}"
    asyncio.run(build_source(source))
    sizes = {n: len(asyncio.run(entries_of(source, n))) for n in asyncio.run(names_of(source))}
    long_tape = max(sizes, key=lambda n: sizes[n])
    asyncio.run(copy_first(source, pg_url, long_tape, 1000))  # as if killed after a batch
    code, out, err = run(monkeypatch, capsys, source, "tapes", "copy", "--to", pg_url)
    assert code == 0, err
    assert f"{long_tape}: 2,502 entries, 1,502 copied, verified" in out
    assert [e.id for e in asyncio.run(entries_of(pg_url, long_tape))] == list(range(1, 2503))
