"""The sandbox tests' shared parts: the bash tools of one backend called as the model would,
leftover-process checks, a loopback listener, workspaces the sandbox uid can reach."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bub_bot.agent import ToolContext, ToolRegistry
from bub_bot.agent.bash import Shell, install_bash
from bub_bot.config import Settings
from bub_bot.tape import SQLiteTapeStore, Tape

BACKENDS = ["bwrap", "landlock"]
SECRET_KEY = "sk-SECRET-API-KEY-in-env"
SECRET_BUB = "bub-SECRET-token-in-env"


def leftovers(marker: str) -> list[int]:
    """Processes whose command line contains `marker`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(name))
    return found


async def no_leftovers(marker: str) -> list[int]:
    """Wait a little for a killed tree to be reaped, then report what is left."""
    for _ in range(50):
        left = leftovers(marker)
        if not left:
            return []
        await asyncio.sleep(0.1)
    return leftovers(marker)


class Bash:
    """The bash tools of one backend, called as the model would (JSON arguments)."""

    def __init__(self, registry: ToolRegistry, shell: Shell, ctx: ToolContext) -> None:
        self.registry = registry
        self.shell = shell
        self.ctx = ctx

    async def call(self, tool: str, **args: Any) -> tuple[bool, Any]:
        return await self.registry.call(self.ctx, tool, json.dumps(args))

    async def run(self, cmd: str, **args: Any) -> dict[str, Any]:
        ok, result = await self.call("bash", cmd=cmd, **args)
        assert ok, result
        return result


@pytest.fixture
def secrets_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Secrets in the bot's environment, as a deployment has them."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    monkeypatch.setenv("BUB_TELEGRAM_WEBHOOK_SECRET", SECRET_BUB)


@pytest.fixture
async def make_bash(
    settings: Callable[..., Settings], store: SQLiteTapeStore, workspace: Path
) -> AsyncIterator[Callable[..., Any]]:
    shells: list[Shell] = []

    async def make(
        backend: str, network: bool = False, ws: Path | None = None, **overrides: Any
    ) -> Bash:
        ws = ws or workspace
        conf = settings(shell_sandbox=backend, **overrides)
        registry = ToolRegistry()
        shell = await install_bash(registry, conf)
        assert shell is not None and shell.availability.name == backend
        shells.append(shell)
        tape = Tape.for_session(store, f"test:{backend}", ws)
        ctx = ToolContext(tape=tape, workspace=ws, settings=conf, network=network)
        return Bash(registry, shell, ctx)

    yield make
    for shell in shells:
        await shell.close()


@pytest.fixture
def reachable_workspace() -> Iterator[Path]:
    """A workspace whose parents the sandbox uid can traverse (as root, bwrap then runs as
    that uid and RLIMIT_NPROC applies; under a 0700 directory it runs as root-in-userns)."""
    top = Path(tempfile.mkdtemp(prefix="bub-test-ws-"))
    top.chmod(0o711)
    (top / "ws").mkdir()
    yield top / "ws"
    shutil.rmtree(top, ignore_errors=True)


class Listener:
    """A TCP port on the host's loopback that records whether anyone connected."""

    def __init__(self) -> None:
        self.hits = 0

    async def __aenter__(self) -> int:
        async def on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.hits += 1
            writer.write(b"hello from the host\n")
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(on, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()


CONNECT = (
    "python3 -c 'import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])),"
    ' timeout=3); print("REACHED", s.recv(100))\' {host} {port}'
)


def failing_bwrap(directory: Path) -> Path:
    """A bwrap that fails as it does in a container without user namespaces."""
    fake = directory / "bwrap-no-userns"
    fake.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace, likely because the"
        " kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    directory.chmod(0o711)
    return fake


@pytest.fixture(params=BACKENDS)
async def bash(request: pytest.FixtureRequest, make_bash: Callable[..., Any]) -> Bash:
    """The bash tools of each backend in turn."""
    return await make_bash(request.param)
