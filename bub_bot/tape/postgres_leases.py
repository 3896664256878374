"""Leases in PostgreSQL: the `bub_leases` table, shared by every replica on the database.

One row per held lease: (key, session_id, owner, expires). Every time is the database's clock
(`now()`), never a replica's, so replicas whose clocks disagree still agree on who holds what.

- acquire: one upsert that takes the row when it is free, lapsed, or already ours; two
  replicas racing for a free key serialise on the primary key and exactly one gets it.
- renew: one UPDATE for every key this process holds; the keys it did not return are lost
  (someone took them over after they lapsed).
- release: DELETE where the owner is us (`release_reading`: in the statement that reads the
  session's queue, which a holder looks at once more after letting go). A handover instead leaves the row lapsed with no
  owner and sends NOTIFY: the others take it at once, and if the notice is lost (a listener
  reconnecting) their sweep still finds the lapsed row.
- lapsed: session rows past their expiry, oldest first, bounded; next_lapse: when the next
  one will be, so the sweep looks right then instead of up to a third of a lease later.

Broadcasts (`broadcast`/`subscribe`) go on a channel of their own (the handover channel's name
plus `_b`, so a replica of an older release, listening for handovers only, never hears them
during a rolling deploy): a notice `broadcast <owner> <topic>`, a newline, then the data as is
(no JSON around it, so its size is exactly known); a handover notice is a JSON object.

NOTIFY channels are per database, not per schema: the channel name carries the schema, so
two bub-bots sharing a database in different schemas never hear each other. The listener has
its own connection (not one of the pool's) and reconnects when it drops or stops answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import asyncpg

from .entries import TapeEntry
from .leases import MAX_BROADCAST, LeaseKey
from .query import POSTGRES, QuerySpec
from .rows import row_entry

log = logging.getLogger("bub_bot.leases")

Connect = Callable[[], Awaitable[asyncpg.Connection]]

_ACQUIRE = """
INSERT INTO bub_leases AS l (key, session_id, owner, expires)
VALUES ($1, $2, $3, now() + make_interval(secs => $4))
ON CONFLICT (key) DO UPDATE
    SET session_id = EXCLUDED.session_id, owner = EXCLUDED.owner, expires = EXCLUDED.expires
    WHERE l.owner = EXCLUDED.owner OR l.expires < now()
RETURNING key
"""

_RENEW = """
UPDATE bub_leases SET expires = now() + make_interval(secs => $3)
WHERE key = ANY($1::text[]) AND owner = $2
RETURNING key
"""

# Ours, or lapsed anyway: marked lapsed with no owner (a row is written even when none was
# there, so a lost notice is still found by the sweep). A live row of another owner is left
# alone: that owner looks at the session again after it releases.
_HANDOVER = """
WITH handed AS (
    INSERT INTO bub_leases AS l (key, session_id, owner, expires)
    VALUES ($1, $2, '', '-infinity')
    ON CONFLICT (key) DO UPDATE SET owner = '', expires = '-infinity'
        WHERE l.owner = $3 OR l.expires < now()
    RETURNING key
)
SELECT pg_notify($4, $5) FROM handed
"""

WAITING = """
INSERT INTO bub_leases AS l (key, session_id, owner, expires)
SELECT k, s, '', '-infinity' FROM unnest($1::text[], $2::text[]) AS w(k, s)
ON CONFLICT (key) DO UPDATE SET owner = '', expires = '-infinity' WHERE l.expires < now()
"""
"""Sessions that have work stored for them by something other than a platform delivery (a due
job), run in the transaction that stores it: a session nobody holds gets a lapsed row, so if
the replica that stored the work dies before taking the lease, the others' sweep finds it
(there is no re-delivery to wake it). A live holder's row is left alone but locked until
commit, so its release waits and its look at the queue after releasing sees the work.
Keys sorted and distinct (one statement must not touch a row twice)."""

_LAPSED = """
SELECT key, session_id FROM bub_leases
WHERE session_id IS NOT NULL AND expires < now()
  AND ($2::text[] IS NULL OR split_part(session_id, ':', 1) = ANY($2::text[]))
ORDER BY expires LIMIT $1
"""

_NEXT_LAPSE = """
SELECT extract(epoch FROM min(expires) - now())::float8 FROM bub_leases
WHERE session_id IS NOT NULL AND owner <> $1 AND expires >= now()
"""

BROADCAST = "broadcast "
"""How a broadcast notice starts (a handover notice is a JSON object)."""

WATCH_SECONDS = 5.0
"""How often the listener connection is checked (and reconnected when it stopped answering)."""


class PostgresLeases:
    """Leases of one owner in `bub_leases`, on the store's pool (see the module docstring)."""

    shared = True

    def __init__(self, pool: asyncpg.Pool, connect: Connect, owner: str, seconds: float) -> None:
        self.pool = pool
        self.owner = owner
        self.seconds = float(seconds)
        self._connect = connect
        self._channel: str | None = None
        self._listener: asyncpg.Connection | None = None
        self._on_handover: Callable[[LeaseKey], None] | None = None
        self._subscribers: dict[str, list[Callable[[str], None]]] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False
        self.watch_seconds = WATCH_SECONDS

    async def channel(self) -> str:
        """The NOTIFY channel of this schema's bub-bot."""
        if self._channel is None:
            async with self.pool.acquire() as conn:
                schema = await conn.fetchval("SELECT current_schema()")
            # Channel names are identifiers (at most 63 bytes): another schema's by a digest.
            digest = hashlib.sha256(str(schema).encode()).hexdigest()[:16]
            self._channel = (
                "bub_handover" if schema in (None, "public") else f"bub_handover_{digest}"
            )
        return self._channel

    async def broadcast_channel(self) -> str:
        """The NOTIFY channel of this schema's broadcasts (see the module docstring)."""
        return f"{await self.channel()}_b"

    # -- leases -------------------------------------------------------------------------------
    async def acquire(self, key: LeaseKey) -> bool:
        async with self.pool.acquire() as conn:
            got = await conn.fetchval(
                _ACQUIRE, key.tape, key.session_id or None, self.owner, self.seconds
            )
        return got is not None

    async def renew(self, keys: Iterable[LeaseKey]) -> set[str]:
        names = sorted({k.tape for k in keys})
        if not names:
            return set()
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(_RENEW, names, self.owner, self.seconds)
        return set(names) - {row["key"] for row in rows}

    async def release(self, key: LeaseKey, *, handover: bool = False, lapse: bool = False) -> None:
        if lapse and not handover:
            async with self.pool.acquire() as conn:
                await conn.execute(
                    "UPDATE bub_leases SET owner = '', expires = '-infinity'"
                    " WHERE key = $1 AND owner = $2",
                    key.tape,
                    self.owner,
                )
            return
        if not handover:
            async with self.pool.acquire() as conn:
                await conn.execute(
                    "DELETE FROM bub_leases WHERE key = $1 AND owner = $2", key.tape, self.owner
                )
            return
        payload = json.dumps({"key": key.tape, "session": key.session_id, "from": self.owner})
        channel = await self.channel()
        async with self.pool.acquire() as conn:
            await conn.execute(
                _HANDOVER, key.tape, key.session_id or None, self.owner, channel, payload
            )

    async def release_reading(self, key: LeaseKey, after_id: int) -> list[TapeEntry] | None:
        # One statement: the DELETE commits with the read. A replica storing a message
        # meanwhile either committed it before this statement's snapshot (read here) or
        # claims after it: its upsert waits for the row this DELETE locked, then finds the
        # lease free and takes it (so it answers).
        spec = QuerySpec.build(key.tape, after_id=after_id, kinds=["message", "event"])
        select, args = POSTGRES.entries(spec, spec.tape, spec.after_id, None, by_name=True)
        n = len(args)
        sql = (
            f"WITH released AS (DELETE FROM bub_leases WHERE key = ${n + 1} AND owner = ${n + 2})"
            f" {select}"
        )
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(sql, *args, key.tape, self.owner)
        return [row_entry(*r) for r in rows]

    async def lapsed(
        self, limit: int = 100, channels: Sequence[str] | None = None
    ) -> list[LeaseKey]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(_LAPSED, limit, None if channels is None else list(channels))
        return [LeaseKey(row["key"], row["session_id"]) for row in rows]

    async def next_lapse(self) -> float | None:
        async with self.pool.acquire() as conn:
            return await conn.fetchval(_NEXT_LAPSE, self.owner)

    # -- handover notices ---------------------------------------------------------------------
    async def listen(self, on_handover: Callable[[LeaseKey], None]) -> None:
        """Start listening (a first connection now; reconnects in the background)."""
        self._on_handover = on_handover
        await self.channel()
        try:
            await self._open_listener()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("leases.listen failed, retrying in the background: %s", exc)
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(
                self._watch(), name="lease-listener"
            )

    @property
    def listening(self) -> bool:
        return self._listener is not None and not self._listener.is_closed()

    async def _open_listener(self) -> None:
        conn = await self._connect()
        try:
            await conn.add_listener(await self.channel(), self._notified)
            await conn.add_listener(await self.broadcast_channel(), self._notified)
        except BaseException:
            await _close(conn)
            raise
        old, self._listener = self._listener, conn
        if old is not None:
            await _close(old)

    # -- broadcasts ---------------------------------------------------------------------------
    async def broadcast(self, topic: str, data: str) -> None:
        if not topic or len(topic.split()) != 1 or topic != topic.strip():
            raise ValueError(f"a broadcast topic is one word, not {topic!r}")
        if "\x00" in data or len(topic.encode()) + len(data.encode()) > MAX_BROADCAST:
            raise ValueError(f"broadcast data for {topic} is too long or holds NUL")
        payload = f"{BROADCAST}{self.owner} {topic}\n{data}"
        channel = await self.broadcast_channel()
        async with self.pool.acquire() as conn:
            await conn.execute("SELECT pg_notify($1, $2)", channel, payload)

    def subscribe(self, topic: str, callback: Callable[[str], None]) -> None:
        self._subscribers.setdefault(topic, []).append(callback)

    def _broadcast_heard(self, payload: str) -> None:
        head, _, data = payload.partition("\n")
        sender, _, topic = head[len(BROADCAST) :].rpartition(" ")
        if sender == self.owner:
            return
        for callback in self._subscribers.get(topic, ()):
            try:
                callback(data)
            except Exception:
                log.exception("leases.broadcast handler failed topic=%s", topic)

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        if payload.startswith(BROADCAST):
            self._broadcast_heard(payload)
            return
        try:
            data = json.loads(payload)
            key = LeaseKey(str(data["key"]), str(data.get("session") or ""))
            sender = data.get("from")
        except (ValueError, KeyError, TypeError):
            # Not its text: a newer release's notice may carry conversation content.
            log.warning("leases.notice unreadable (%d bytes)", len(payload))
            return
        if sender == self.owner or self._on_handover is None:
            return
        try:
            self._on_handover(key)
        except Exception:
            log.exception("leases.notice handler failed key=%s", key.tape)

    async def _watch(self) -> None:
        """Keep the listener connected: check it every few seconds, reconnect when it is gone
        or does not answer (a dropped TCP connection is not always noticed otherwise)."""
        failures = 0
        while not self._closed:
            await asyncio.sleep(min(self.watch_seconds * 2**failures, 30.0))
            conn = self._listener
            try:
                if conn is None or conn.is_closed():
                    raise ConnectionError("listener connection closed")
                await conn.fetchval("SELECT 1", timeout=max(self.watch_seconds, 1.0))
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if failures == 0:
                    log.warning("leases.listener lost (%s); reconnecting", exc)
            try:
                await self._open_listener()
                log.info("leases.listener reconnected")
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                log.warning("leases.listener reconnect failed: %s", exc)

    async def close(self) -> None:
        self._closed = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher
            self._watcher = None
        if self._listener is not None:
            await _close(self._listener)
            self._listener = None


async def _close(conn: asyncpg.Connection) -> None:
    try:
        await asyncio.wait_for(conn.close(), 5)
    except Exception:
        conn.terminate()
