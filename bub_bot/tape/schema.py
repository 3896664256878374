"""Schema versions and upgrades of both stores: the tables, numbered migrations, and the code
that runs the missing ones when a store opens.

A store's MIGRATIONS[n] takes its database from version n-1 to n; a new database runs them all
from 1. The next schema change appends MIGRATIONS[n+1] and bumps the version: opening an older
database upgrades it in one transaction before anything else, and an older bub-bot refuses the
newer database before writing anything. Migrations only add (tables, columns with defaults,
indexes), so replicas still on the previous release keep working during a rolling deploy.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from .entries import utc_now
from .store import TapeStoreError

if TYPE_CHECKING:
    import asyncpg

# -- SQLite -------------------------------------------------------------------------------
SQLITE_VERSION = 5
"""The schema this code writes; kept in `PRAGMA user_version`."""

SQLITE_MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE IF NOT EXISTS tapes (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    role        TEXT NOT NULL,               -- live | sidecar | archive
    session_id  TEXT,
    created     TEXT NOT NULL,
    updated     TEXT NOT NULL                -- set on create, rename and reset only
);
CREATE TABLE IF NOT EXISTS entries (
    tape    INTEGER NOT NULL,
    id      INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    name    TEXT,                            -- anchor/event name or message role
    payload TEXT NOT NULL,
    meta    TEXT NOT NULL,
    date    TEXT NOT NULL,
    UNIQUE (tape, id)
);
-- Counters come from indexes (max id, anchors by id), not from a tapes row rewritten on
-- every append. Partial indexes: only anchors and events are looked up by name, so message
-- and tool entries (most of a tape) cost no index writes beyond (tape, id).
CREATE INDEX IF NOT EXISTS anchors_by_id ON entries (tape, id) WHERE kind = 'anchor';
CREATE INDEX IF NOT EXISTS anchors_by_name ON entries (tape, name, id) WHERE kind = 'anchor';
CREATE INDEX IF NOT EXISTS events_by_name ON entries (tape, name, id) WHERE kind = 'event';
CREATE TABLE IF NOT EXISTS dedupe (
    key      TEXT PRIMARY KEY,
    tape     TEXT NOT NULL,
    entry_id INTEGER NOT NULL,
    date     TEXT NOT NULL
);
""",
    # A session's live tapes by session id (a workspace map that changed keeps a started
    # conversation in the workspace it started in).
    2: """
CREATE INDEX IF NOT EXISTS tapes_by_session ON tapes (session_id) WHERE role = 'live';
""",
    # Jobs: durable timers (tape/jobs.py). `due` is UNIX seconds; `data` the kind's JSON.
    3: """
CREATE TABLE IF NOT EXISTS jobs (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    tape        TEXT NOT NULL,
    workspace   TEXT NOT NULL,
    channel     TEXT NOT NULL,
    due         REAL NOT NULL,
    cron        TEXT,
    tz          TEXT NOT NULL,
    data        TEXT NOT NULL,
    created     TEXT NOT NULL,
    fired       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_by_due ON jobs (due);
CREATE INDEX IF NOT EXISTS jobs_by_session ON jobs (session_id, kind);
""",
    # Forks (tape/forks.py): a fork's row names its parent tape and the parent's last id at
    # the fork point (`base`); the fork's own entries continue at base + 1.
    4: """
ALTER TABLE tapes ADD COLUMN parent TEXT;
ALTER TABLE tapes ADD COLUMN base INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS tapes_by_parent ON tapes (parent) WHERE parent IS NOT NULL;
""",
    # Usage counters (tape/usage.py): one row per key and window, incremented in place.
    5: """
CREATE TABLE IF NOT EXISTS usage (
    key         TEXT NOT NULL,
    win         TEXT NOT NULL,
    messages    INTEGER NOT NULL DEFAULT 0,
    tokens_in   INTEGER NOT NULL DEFAULT 0,
    tokens_out  INTEGER NOT NULL DEFAULT 0,
    cost        INTEGER NOT NULL DEFAULT 0,
    estimated   INTEGER NOT NULL DEFAULT 0,
    updated     TEXT NOT NULL,
    PRIMARY KEY (key, win)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS usage_by_window ON usage (win);
""",
}


def migrate_sqlite(
    conn: sqlite3.Connection,
    migrations: dict[int, str] = SQLITE_MIGRATIONS,
    version: int = SQLITE_VERSION,
) -> None:
    """Bring the file to schema `version` (running the missing `migrations` in order, in one
    transaction); refuse a newer file before changing anything in it."""
    conn.execute("PRAGMA busy_timeout = 10000")
    # Refuse a newer file before changing anything in it (not even its journal mode).
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > version:
        raise TapeStoreError(
            f"schema version {found} is newer than this bub-bot supports ({version});"
            " upgrade bub-bot"
        )
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() not in ("wal", "memory"):
        raise TapeStoreError(f"could not switch to WAL (journal_mode is {mode})")
    conn.execute("PRAGMA synchronous = NORMAL")
    if found == version:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Read again under the write lock: another process may have upgraded meanwhile.
        found = conn.execute("PRAGMA user_version").fetchone()[0]
        for step in range(found + 1, version + 1):
            for statement in migrations[step].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {step}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


# -- PostgreSQL ---------------------------------------------------------------------------
POSTGRES_VERSION = 6
"""The schema this code writes; recorded in `bub_schema_version` (one row per upgrade)."""

# Schema setup and upgrades hold this transaction-scoped advisory lock, so replicas starting
# together run them once.
POSTGRES_LOCK = 0x6275625F73636801

# PostgreSQL tables are prefixed `bub_`; text columns use the "C" collation (byte order, ASCII-only
# lower(), as SQLite). The version is recorded in `bub_schema_version`, one row per upgrade.
POSTGRES_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE bub_tapes (
            id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            name        text COLLATE "C" NOT NULL UNIQUE,
            role        text NOT NULL,            -- live | sidecar | archive
            session_id  text,
            created     text NOT NULL,
            updated     text COLLATE "C" NOT NULL, -- set on create, rename and reset only
            last_id     bigint NOT NULL DEFAULT 0  -- id allocation only; counters use indexes
        )""",
        """CREATE TABLE bub_entries (
            tape    bigint NOT NULL,
            id      bigint NOT NULL,
            kind    text COLLATE "C" NOT NULL,
            name    text COLLATE "C",             -- anchor/event name or message role
            payload text COLLATE "C" NOT NULL,
            meta    text COLLATE "C" NOT NULL,
            date    text COLLATE "C" NOT NULL,
            PRIMARY KEY (tape, id)
        )""",
        # Counters come from indexes; only anchors and events are looked up by name.
        "CREATE INDEX bub_anchors_by_id ON bub_entries (tape, id) WHERE kind = 'anchor'",
        "CREATE INDEX bub_anchors_by_name ON bub_entries (tape, name, id) WHERE kind = 'anchor'",
        "CREATE INDEX bub_events_by_name ON bub_entries (tape, name, id) WHERE kind = 'event'",
        """CREATE TABLE bub_dedupe (
            key       text COLLATE "C" PRIMARY KEY,
            tape      text NOT NULL,
            entry_id  bigint NOT NULL,
            date      text NOT NULL
        )""",
    ),
    2: ("CREATE INDEX bub_tapes_by_session ON bub_tapes (session_id) WHERE role = 'live'",),
    # Leases of several replicas on one database (tape/postgres_leases.py): a session's
    # (key = its tape, with the session id) or a job's (session_id NULL). Only held leases
    # have rows; `expires` is the database's clock.
    3: (
        """CREATE TABLE bub_leases (
            key         text COLLATE "C" PRIMARY KEY,
            session_id  text,
            owner       text NOT NULL,
            expires     timestamptz NOT NULL
        )""",
    ),
    # Jobs: durable timers (tape/jobs.py), claimed with FOR UPDATE SKIP LOCKED by the
    # replica that fires them. `due` is UNIX seconds; `data` the kind's JSON.
    4: (
        """CREATE TABLE bub_jobs (
            id          text COLLATE "C" PRIMARY KEY,
            kind        text COLLATE "C" NOT NULL,
            session_id  text COLLATE "C" NOT NULL,
            tape        text COLLATE "C" NOT NULL,
            workspace   text NOT NULL,
            channel     text COLLATE "C" NOT NULL,
            due         double precision NOT NULL,
            cron        text,
            tz          text NOT NULL,
            data        text NOT NULL,
            created     text NOT NULL,
            fired       bigint NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX bub_jobs_by_due ON bub_jobs (due)",
        "CREATE INDEX bub_jobs_by_session ON bub_jobs (session_id, kind)",
    ),
    # Forks (tape/forks.py): a fork's row names its parent tape and the parent's last id at
    # the fork point (`base`); the fork's `last_id` starts there.
    5: (
        'ALTER TABLE bub_tapes ADD COLUMN parent text COLLATE "C"',
        "ALTER TABLE bub_tapes ADD COLUMN base bigint NOT NULL DEFAULT 0",
        "CREATE INDEX bub_tapes_by_parent ON bub_tapes (parent) WHERE parent IS NOT NULL",
    ),
    # Usage counters (tape/usage.py): one row per key and window, incremented in place by an
    # upsert, so every replica adds to the same row.
    6: (
        """CREATE TABLE bub_usage (
            key         text COLLATE "C" NOT NULL,
            win         text COLLATE "C" NOT NULL,
            messages    bigint NOT NULL DEFAULT 0,
            tokens_in   bigint NOT NULL DEFAULT 0,
            tokens_out  bigint NOT NULL DEFAULT 0,
            cost        bigint NOT NULL DEFAULT 0,
            estimated   bigint NOT NULL DEFAULT 0,
            updated     text NOT NULL,
            PRIMARY KEY (key, win)
        )""",
        "CREATE INDEX bub_usage_by_window ON bub_usage (win)",
    ),
}


async def migrate_postgres(
    pool: asyncpg.Pool,
    migrations: dict[int, tuple[str, ...]] = POSTGRES_MIGRATIONS,
    version: int = POSTGRES_VERSION,
) -> int:
    """Bring the schema to `version` (creating it, or running the missing `migrations` in
    order, in one transaction); refuse a newer schema before writing anything."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", POSTGRES_LOCK)
        exists = await conn.fetchval("SELECT to_regclass('bub_schema_version') IS NOT NULL")
        found = 0
        if exists:
            found = await conn.fetchval("SELECT coalesce(max(version), 0) FROM bub_schema_version")
        if found > version:
            raise TapeStoreError(
                f"schema version {found} is newer than this bub-bot supports ({version});"
                " upgrade bub-bot"
            )
        if not exists:
            await conn.execute(
                "CREATE TABLE bub_schema_version ("
                " version integer PRIMARY KEY, applied text NOT NULL)"
            )
        for step in range(found + 1, version + 1):
            for statement in migrations[step]:
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO bub_schema_version (version, applied) VALUES ($1, $2)",
                step,
                utc_now(),
            )
    return version
