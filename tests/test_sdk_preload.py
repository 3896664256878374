"""The openai SDK is loaded off the event loop once `serve` started, before the first turn.

Run in a fresh interpreter (tests/sdk_preload_child.py): this process imported the SDK long
ago. An audit hook there records the thread of every import; no wall time is measured.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from tests.fakes.openai_server import FakeOpenAI

CHILD = Path(__file__).with_name("sdk_preload_child.py")
ROOT = CHILD.parents[1]


async def test_serve_loads_the_sdk_in_a_worker_thread_before_the_first_turn(
    fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    (tmp_path / "ws").mkdir()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        fake_openai.base_url,
        str(tmp_path / "home"),
        str(tmp_path / "ws"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0, err.decode()
    got = json.loads(out.decode().strip().splitlines()[-1])
    assert got["sent"] == ["echo: hello"]
    assert got["at_start"] is False  # not loaded by opening the bot: start-up stays short
    assert got["sdk_threads"], "the SDK was never imported"
    assert got["main"] not in got["sdk_threads"]  # every SDK module: a worker thread
    assert got["turn_imports"] == []  # the first turn imported nothing on the event loop
