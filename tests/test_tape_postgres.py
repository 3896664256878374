"""The PostgreSQL store on a real server: settings, start-up failures, schema versions and
upgrades, writers in several processes, readiness and doctor. (Behaviour shared with SQLite is
in test_tape_store.py and test_tape_context.py, which run on both stores.)"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from bub_bot.config import ConfigError, load_settings
from bub_bot.doctor import check_storage
from bub_bot.server import Bot, BotServer
from bub_bot.tape import TapeEntry, TapeStoreError, open_store, parse_database_url
from bub_bot.tape.schema import POSTGRES_MIGRATIONS as MIGRATIONS
from bub_bot.tape.schema import POSTGRES_VERSION as SCHEMA_VERSION
from bub_bot.tape.schema import migrate_postgres as migrate
from tests.pg import PASSWORD, PostgresCluster
from tests.runtime_channel import RuntimeChannel
from tests.serve_process import free_port

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).with_name("tape_pg_writer_child.py")
SECRET = "SECRET-pw-4242"


def msg(text: str) -> TapeEntry:
    return TapeEntry.message({"role": "user", "content": text})


def assert_one_line(error: BaseException, *needles: str) -> str:
    text = str(error)
    assert "\n" not in text, text
    for needle in needles:
        assert needle in text, text
    assert SECRET not in text and PASSWORD not in text, text
    return text


async def open_error(url: str) -> TapeStoreError:
    with pytest.raises(TapeStoreError) as caught:
        async with open_store(url):
            pass
    return caught.value


# -- settings ---------------------------------------------------------------------------------


def database_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str):
    for name in ("BUB_DATABASE_URL", "DATABASE_URL", "BUB_DATABASE_POOL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings(
        _env_file=None, require_model=False, home=tmp_path / "home", workspace=tmp_path
    )


def test_database_url_settings(monkeypatch, tmp_path) -> None:
    unset = database_settings(monkeypatch, tmp_path)
    assert unset.database == f"sqlite:///{tmp_path / 'home' / 'bub.db'}"
    assert unset.database_path == str(tmp_path / "home" / "bub.db")
    assert unset.database_pool_size == 10
    assert parse_database_url(unset.database).kind == "sqlite"

    paas = database_settings(monkeypatch, tmp_path, DATABASE_URL="postgres://u:pw@db:5432/app")
    assert paas.database == "postgres://u:pw@db:5432/app"
    assert paas.database_setting == "DATABASE_URL"
    # BUB_DATABASE_URL wins; an empty one falls back to DATABASE_URL (a PaaS must never end
    # up on the dyno's disk because .env had an empty line).
    both = database_settings(
        monkeypatch,
        tmp_path,
        DATABASE_URL="postgres://u:pw@db/app",
        BUB_DATABASE_URL="postgresql://me@other/bub",
        BUB_DATABASE_POOL_SIZE="3",
    )
    assert both.database == "postgresql://me@other/bub" and both.database_pool_size == 3
    empty = database_settings(
        monkeypatch, tmp_path, DATABASE_URL="postgres://u:pw@db/app", BUB_DATABASE_URL=""
    )
    assert empty.database == "postgres://u:pw@db/app"
    sqlite = database_settings(monkeypatch, tmp_path, BUB_DATABASE_URL="sqlite:///rel/b.db")
    assert sqlite.database_path == "rel/b.db"


@pytest.mark.parametrize(
    ("env", "needles"),
    [
        ({"BUB_DATABASE_URL": f"mysql://u:{SECRET}@db/x"}, ["BUB_DATABASE_URL", "'mysql'"]),
        ({"DATABASE_URL": f"redis://u:{SECRET}@db/0"}, ["DATABASE_URL", "'redis'"]),
        (
            {"BUB_DATABASE_URL": f"postgresql://u:{SECRET}@db:99999/x"},
            ["Port out of range", "db:99999"],
        ),
        ({"BUB_DATABASE_URL": "postgresql://u@db:port/x"}, ["BUB_DATABASE_URL", "Port"]),
        ({"BUB_DATABASE_POOL_SIZE": "0"}, ["BUB_DATABASE_POOL_SIZE"]),
        ({"BUB_DATABASE_POOL_SIZE": "many"}, ["BUB_DATABASE_POOL_SIZE"]),
    ],
)
def test_bad_database_settings_fail_naming_the_setting(monkeypatch, tmp_path, env, needles):
    with pytest.raises(ConfigError) as caught:
        database_settings(monkeypatch, tmp_path, **env)
    assert_one_line(caught.value, *needles)


def test_open_store_refuses_unknown_schemes() -> None:
    with pytest.raises(ValueError, match="'mysql'"):
        open_store(f"mysql://u:{SECRET}@db/x")


# -- start-up failures: one line naming the host, never the password ------------------------------


async def test_unreachable_server_fails_with_one_line(pg_cluster) -> None:
    port = free_port()  # nothing listens there
    error = await open_error(f"postgresql://bub:{SECRET}@127.0.0.1:{port}/bub")
    assert_one_line(error, f"postgresql://bub@127.0.0.1:{port}/bub")


async def test_wrong_password_fails_with_one_line(pg_cluster) -> None:
    error = await open_error(pg_cluster.url("postgres", password=SECRET))
    text = assert_one_line(error, f"127.0.0.1:{pg_cluster.port}", "password authentication")
    assert "bub@" in text


async def test_missing_database_fails_with_one_line(pg_cluster) -> None:
    error = await open_error(pg_cluster.url("no_such_db"))
    assert_one_line(error, f"127.0.0.1:{pg_cluster.port}/no_such_db", "does not exist")


def test_cli_start_failure_is_one_line(monkeypatch, tmp_path, capsys) -> None:
    from bub_bot.__main__ import main

    port = free_port()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BUB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BUB_WORKSPACE", str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", f"postgres://bub:{SECRET}@127.0.0.1:{port}/app")
    assert main(["tapes", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bub-bot: cannot open tape database"), err
    assert f"127.0.0.1:{port}" in err and SECRET not in err


# -- schema ---------------------------------------------------------------------------------------


async def tables(url: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        )
        return {r[0] for r in rows}
    finally:
        await conn.close()


async def test_schema_created_at_first_start_and_versioned(pg_url) -> None:
    async with open_store(pg_url) as store:
        assert store.kind == "postgresql" and store.schema_version == SCHEMA_VERSION
        await store.append("t", msg("x"))
    async with open_store(pg_url) as store:  # a second start changes nothing
        assert (await store.stats("t")).entries == 1
    assert await tables(pg_url) == {
        "bub_schema_version",
        "bub_tapes",
        "bub_entries",
        "bub_dedupe",
        "bub_leases",
        "bub_jobs",
        "bub_usage",
    }
    conn = await asyncpg.connect(pg_url)
    try:
        versions = await conn.fetch("SELECT version FROM bub_schema_version ORDER BY version")
    finally:
        await conn.close()
    assert [r[0] for r in versions] == list(range(1, SCHEMA_VERSION + 1))


async def test_newer_schema_is_refused_before_anything_is_written(pg_url) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(
            "CREATE TABLE bub_schema_version (version integer PRIMARY KEY, applied text NOT NULL)"
        )
        await conn.execute(
            "INSERT INTO bub_schema_version VALUES ($1, 'later')", SCHEMA_VERSION + 1
        )
    finally:
        await conn.close()
    error = await open_error(pg_url)
    assert_one_line(error, f"schema version {SCHEMA_VERSION + 1} is newer", "upgrade bub-bot")
    assert await tables(pg_url) == {"bub_schema_version"}


async def test_upgrade_path_runs_the_next_migration_once(pg_url) -> None:
    """The next release adds MIGRATIONS[n+1]: an existing database is upgraded at start, in one
    transaction, keeping its data; this release then refuses the upgraded database."""
    async with open_store(pg_url) as store:
        await store.append_many("t", [msg("before the upgrade"), TapeEntry.anchor("A")])
    nxt = SCHEMA_VERSION + 1
    upgrade = {
        **MIGRATIONS,
        nxt: ("CREATE TABLE bub_upgrade_probe (tape bigint PRIMARY KEY, note text NOT NULL)",),
    }
    pool = await asyncpg.create_pool(pg_url, min_size=1, max_size=2)
    try:
        assert await migrate(pool, upgrade, nxt) == nxt
        assert await migrate(pool, upgrade, nxt) == nxt  # already there: nothing runs twice
        async with pool.acquire() as conn:
            versions = [r[0] for r in await conn.fetch("SELECT version FROM bub_schema_version")]
    finally:
        await pool.close()
    assert sorted(versions) == list(range(1, nxt + 1))
    assert "bub_upgrade_probe" in await tables(pg_url)
    error = await open_error(pg_url)
    assert_one_line(error, f"schema version {nxt} is newer")


async def test_replicas_starting_together_create_the_schema_once(pg_url) -> None:
    stores = await asyncio.gather(*(open_store(pg_url) for _ in range(4)))
    try:
        await asyncio.gather(*(s.append("t", msg(f"r{i}")) for i, s in enumerate(stores)))
        assert (await stores[0].stats("t")).entries == 4
    finally:
        await asyncio.gather(*(s.close() for s in stores))


# -- pool, readiness, doctor -----------------------------------------------------------------------


async def test_pool_size_and_read_only_database(pg_url, tmp_path) -> None:
    conf = load_settings(
        _env_file=None,
        require_model=False,
        home=tmp_path,
        workspace=tmp_path,
        database_url=pg_url,
        database_pool_size=3,
    )
    async with open_store(conf) as store:
        assert store.pool.get_max_size() == 3  # type: ignore[attr-defined]
        await store.ping()
        await store.probe()
        # Connections are handed back: more concurrent work than the pool holds completes.
        await asyncio.gather(*(store.append("t", msg(str(i))) for i in range(20)))
        assert (await store.stats("t")).entries == 20
    async with open_store(pg_url + "&default_transaction_read_only=on") as store:
        with pytest.raises(TapeStoreError, match="read-only"):
            await store.ping()
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            await store.probe()
        assert (await store.stats("t")).entries == 20  # reads still work


async def test_doctor_checks_the_database(pg_cluster, pg_url, tmp_path) -> None:
    def conf(url: str):
        return load_settings(
            _env_file=None, require_model=False, home=tmp_path, workspace=tmp_path, database_url=url
        )

    result = await check_storage(conf(pg_url))
    assert result.ok, result.detail
    assert result.detail.startswith(f"postgresql postgresql://bub@127.0.0.1:{pg_cluster.port}/"), (
        result.detail
    )
    assert f"schema v{SCHEMA_VERSION}, write/read ok, 0 live tapes" in result.detail
    assert PASSWORD not in result.detail
    bad = await check_storage(conf(pg_cluster.url("postgres", password=SECRET)))
    assert not bad.ok
    assert_one_line(bad.detail, f"127.0.0.1:{pg_cluster.port}", "password")  # type: ignore[arg-type]
    assert "BUB_DATABASE_URL" in bad.fix


async def test_readyz_reports_store_kind_and_reachability(settings, tmp_path) -> None:
    own = PostgresCluster().start()  # this test stops its server
    try:
        channel = RuntimeChannel()
        bot = await Bot.open(settings(database_url=own.url()), [channel])
        server = BotServer(bot, host="127.0.0.1", port=0)
        await server.start()
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{server.url}/readyz") as resp:
                    body = await resp.json()
                    assert resp.status == 200, body
                    assert body["store"] == "postgresql" and body["database"] == "ok"
                own.stop()
                async with http.get(f"{server.url}/readyz") as resp:
                    body = await resp.json()
                    assert resp.status == 503
                    assert body["store"] == "postgresql"
                    assert body["database"].startswith("error: "), body
                    assert PASSWORD not in json.dumps(body)
        finally:
            await server.stop()
    finally:
        own.stop()


# -- several processes on one tape ------------------------------------------------------------------


async def test_writers_in_several_processes_keep_ids_dense(pg_url) -> None:
    workers, rounds = 4, 60
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(CHILD),
            pg_url,
            str(w),
            str(rounds),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        for w in range(workers)
    ]
    async with asyncio.timeout(120):
        for proc in procs:
            assert proc.stdout is not None
            line = await proc.stdout.readline()
            assert line.strip() == b"ready", (line, await proc.stderr.read())  # type: ignore[union-attr]
        for proc in procs:  # everyone starts at once
            proc.stdin.write(b"go\n")  # type: ignore[union-attr]
            await proc.stdin.drain()  # type: ignore[union-attr]
        outputs = [await proc.communicate() for proc in procs]
    reports = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))

    async with open_store(pg_url) as store:
        names = {t.name for t in await store.list_tapes(include_all=True)}
        family = sorted(n for n in names if n.startswith("shared"))
        # Two resets: the live tape, two archives, and a sidecar beside each.
        assert sum(r["resets"] for r in reports) == 2
        assert len([n for n in family if "__sidecar__" not in n]) == 3
        messages: list[str] = []
        spilled: list[str] = []
        for name in family:
            entries = await store.query(name)
            assert [e.id for e in entries] == list(range(1, len(entries) + 1)), name
            assert (await store.stats(name)).entries == len(entries)
            texts = [e.payload["content"] for e in entries if e.kind == "message"]
            (spilled if "__sidecar__" in name else messages).extend(texts)
        written = [t for r in reports for t in r["written"]]
        assert sorted(messages) == sorted(written)  # every entry once, none lost in a reset
        assert sorted(spilled) == sorted(
            f"spill-w{w}-{i}" for w in range(workers) for i in range(rounds)
        )

        # One delivery reaching every process is stored once.
        assert sum(r["won"] for r in reports) == 10
        dedupe = await store.query("dedupe")
        assert [e.id for e in dedupe] == list(range(1, 11))
        assert all([await store.is_duplicate(f"delivery:{k}") for k in range(10)])
        # The bootstrap anchor is written by exactly one of them.
        assert sum(r["booted"] for r in reports) == 1
        assert [e.kind for e in await store.query("boot")] == ["anchor"]
