"""Run one launch: a process group of its own, stdout+stderr merged and capped (head and
tail kept), a wall-clock timeout that kills the whole tree, and draining to EOF after a kill
(a paused pipe never sees EOF and `wait()` would hang)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from .base import Launch
from .landlock import clean

KILL_GRACE = 2.0
"""Seconds a supervisor gets to kill its tree after SIGTERM before the group is SIGKILLed."""
CHUNK = 65536


class SandboxStartError(Exception):
    """The sandbox could not start the command (never retried unsandboxed)."""


@dataclass
class Capture:
    """Output kept under a cap: the first 3/4 and the last 1/4 of it; `dropped` bytes cut."""

    cap: int
    head: bytearray
    tail: bytearray
    dropped: int = 0
    total: int = 0

    @classmethod
    def of(cls, cap: int) -> Capture:
        return cls(cap, bytearray(), bytearray())

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap * 3 // 4 - len(self.head)
        if room > 0 and not self.tail and not self.dropped:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        keep = self.cap - len(self.head)
        if len(self.tail) > keep:
            self.dropped += len(self.tail) - keep
            del self.tail[: len(self.tail) - keep]

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        if not self.dropped:
            return head + self.tail.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        return (
            f"{head}\n[... {self.dropped} bytes of output cut here (BUB_SHELL_MAX_OUTPUT"
            f" keeps {self.cap} bytes: the start and the end) ...]\n{tail}"
        )


@dataclass
class Outcome:
    """How a command ended."""

    exit_code: int | None
    output: str
    timed_out: bool = False
    killed: bool = False
    truncated: bool = False
    output_bytes: int = 0


class Running:
    """A started command; `wait()` collects it, `kill()` stops the whole tree."""

    def __init__(self, proc: asyncio.subprocess.Process, launch: Launch, cap: int) -> None:
        self.proc = proc
        self.launch = launch
        self.capture = Capture.of(cap)
        self.killed = False
        self.on_output: Callable[[bytes], None] | None = None

    async def kill(self) -> None:
        """Stop the command and everything it started."""
        self.killed = True
        pid = self.proc.pid
        if self.proc.returncode is not None:
            return
        try:
            if self.launch.graceful:
                os.kill(pid, signal.SIGTERM)  # the supervisor SIGKILLs its subtree
                try:
                    await asyncio.wait_for(asyncio.shield(self.proc.wait()), KILL_GRACE)
                except TimeoutError:
                    pass
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    async def _pump(self) -> None:
        assert self.proc.stdout is not None
        while True:
            data = await self.proc.stdout.read(CHUNK)
            if not data:
                return
            self.capture.add(data)
            if self.on_output is not None:
                self.on_output(data)

    async def wait(self, timeout: float | None) -> Outcome:
        """Read to EOF under `timeout` seconds (None: none), then reap."""
        timed_out = False
        pump = asyncio.ensure_future(self._pump())
        try:
            try:
                await asyncio.wait_for(asyncio.shield(pump), timeout)
            except TimeoutError:
                timed_out = True
                await self.kill()
                await pump  # drain to EOF: the tree is dead, the pipe closes
            except asyncio.CancelledError:
                await self.kill()
                await asyncio.shield(pump)
                raise
            code = await self.proc.wait()
        finally:
            clean(self.launch.cleanup)
        return Outcome(
            exit_code=code,
            output=self.capture.text(),
            timed_out=timed_out,
            killed=self.killed,
            truncated=bool(self.capture.dropped),
            output_bytes=self.capture.total,
        )


async def start(launch: Launch, cap: int) -> Running:
    """Start `launch` in a new session, stdin closed, no inherited fds."""
    try:
        kwargs: dict = {}
        if launch.pass_fd is not None:
            kwargs["pass_fds"] = (launch.pass_fd,)
        proc = await asyncio.create_subprocess_exec(
            *launch.argv,
            env=launch.env,
            cwd=launch.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            **kwargs,
        )
    except OSError as exc:
        clean(launch.cleanup)
        raise SandboxStartError(f"cannot start {launch.argv[0]}: {exc}") from exc
    finally:
        if launch.pass_fd is not None:
            os.close(launch.pass_fd)
    return Running(proc, launch, cap)


START_FAILURES = (
    "bwrap: ",
    "sandbox: landlock setup failed",
)
"""How a launcher says it failed before the command ran (with exit code 1 or 126)."""


def start_failure(outcome: Outcome) -> str | None:
    """The launcher's own error when the sandbox failed to start the command, else None."""
    if outcome.exit_code not in (1, 126) or outcome.timed_out or outcome.killed:
        return None
    first = outcome.output.lstrip().splitlines()[:1]
    if first and first[0].startswith(START_FAILURES):
        return first[0].strip()
    return None
