"""Child of tests/test_sdk_preload.py: a fresh interpreter (the test process has the SDK
loaded already) starts `BotServer` with the CLI channel, waits for the SDK's preload,
answers one message, and prints as JSON where each import of the SDK ran (an audit hook
records the thread of every `import` event) and what the first turn imported still.

    python tests/sdk_preload_child.py BASE_URL HOME WORKSPACE
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import threading

imports: list[tuple[str, str]] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "import":
        imports.append((str(args[0]), threading.current_thread().name))


sys.addaudithook(_audit)

from bub_bot.config import load_settings  # noqa: E402
from bub_bot.server import Bot, BotServer  # noqa: E402
from channels.cli import CliChannel  # noqa: E402


async def main(base_url: str, home: str, workspace: str) -> None:
    settings = load_settings(
        openai_base_url=base_url,
        openai_api_key="sk-test",
        model="fake-model",
        workspace=workspace,
        home=home,
        model_retries=0,
        _env_file=None,
    )
    channel = CliChannel(out=io.StringIO())
    bot = await Bot.open(settings, [channel])
    server = BotServer(bot, host="127.0.0.1", port=0)
    at_start = "openai" in sys.modules
    await server.start()
    try:
        loading = bot.agent.model.preload()  # the one `start` began (the same future)
        if loading is not None:
            await loading
        before = set(sys.modules)
        first = len(imports)
        inbound = channel.inbound("hello", "preload")
        await bot.runtime.receive(inbound)
        await bot.runtime.wait_idle(inbound.session_id, timeout=20)
    finally:
        await server.stop()
    sdk = sorted({thread for name, thread in imports if name.split(".")[0] == "openai"})
    print(
        json.dumps(
            {
                "at_start": at_start,
                "sdk_threads": sdk,
                "main": threading.main_thread().name,
                "turn_new_modules": sorted({m.split(".")[0] for m in set(sys.modules) - before}),
                "turn_imports": [name for name, _ in imports[first:]],
                "sent": channel.sent,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
