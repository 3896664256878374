"""A bot-like process for test_sandbox: starts a background `bash` job, prints READY, then
waits to be SIGKILLed (the test checks that the job's processes die with it).

    python bash_kill_child.py BACKEND WORKSPACE HOME MARKER
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path


async def main() -> None:
    from bub_bot.agent import ToolContext, ToolRegistry
    from bub_bot.agent.bash import install_bash
    from bub_bot.config import load_settings
    from bub_bot.tape import SQLiteTapeStore, Tape

    backend, workspace, home, marker = sys.argv[1:5]
    ws = Path(workspace)
    settings = load_settings(
        require_model=False, home=home, workspace=ws, shell_sandbox=backend, _env_file=None
    )
    registry = ToolRegistry()
    await install_bash(registry, settings)
    store = await SQLiteTapeStore.open(str(Path(home) / "child.db"))
    ctx = ToolContext(tape=Tape.for_session(store, "kill", ws), workspace=ws, settings=settings)
    cmd = f"setsid sleep {marker} & (trap '' TERM; sleep {marker}) & sleep {marker}"
    ok, result = await registry.call(ctx, "bash", json.dumps({"cmd": cmd, "background": True}))
    assert ok, result
    await asyncio.sleep(0.5)  # the sleeps are running
    print("READY", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main())
