"""A `bub-bot serve` subprocess: a free port for it, and waiting until it is ready (tests and
benchmarks share this)."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import aiohttp


def free_port() -> int:
    """A loopback port nothing listens on (at the time of asking)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_ready(
    url: str, proc: asyncio.subprocess.Process, log: Path | None = None, timeout: float = 60
) -> None:
    """Poll `url`/readyz until it answers 200; AssertionError (with the end of the log) when
    the process exits first or the time runs out."""

    def tail() -> str:
        return log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise AssertionError(f"bub-bot serve exited with {proc.returncode}:\n{tail()}")
            try:
                async with http.get(f"{url}/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"bub-bot serve not ready in {timeout:.0f} s:\n{tail()}")
