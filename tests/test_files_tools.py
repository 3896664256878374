"""Files and the acting tools together: a file someone sent is readable by the sandboxed
`bash` (as root, commands run as BUB_SHELL_UID on a workspace handed over to it), and
`send_file` is a tool of the `fs` group, so BUB_TOOLS and a workspace rule's `tools` narrow it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import sandbox_harness, test_telegram
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.fakes.telegram_api import FakeTelegram

USER = test_telegram.USER
start = test_telegram.start  # the Telegram harness's fixtures
tg = test_telegram.tg
reachable_workspace = sandbox_harness.reachable_workspace


def _offered(fake_openai: FakeOpenAI) -> set[str]:
    first = fake_openai.completion_requests()[-1].body
    return {t["function"]["name"] for t in first.get("tools", [])}


def _tool_results(fake_openai: FakeOpenAI) -> list[str]:
    return [m["content"] for m in fake_openai.last_messages() if m["role"] == "tool"]


@pytest.mark.parametrize("backend", sandbox_harness.BACKENDS)
@pytest.mark.parametrize("reachable", [True, False], ids=["reachable", "closed-parents"])
async def test_a_received_file_is_readable_by_the_sandboxed_bash(
    start,
    tg: FakeTelegram,
    fake_openai: FakeOpenAI,
    reachable_workspace: Path,
    workspace: Path,
    backend: str,
    reachable: bool,
) -> None:
    # Closed parents (a 0700 directory above): bwrap as root runs root-in-userns, the
    # Landlock helper still drops to the sandbox uid (its HOME is then the private tmp).
    where = reachable_workspace if reachable else workspace
    h = await start(workspace=where, shell_sandbox=backend)
    csv = b"name,qty\napple,3\npear,5\n"
    fake_openai.script(
        tool_calls([("bash", {"cmd": "id -u; cat inbox/*.csv; touch inbox/made-here"})]),
        text("read it"),
    )
    tg.push_update(tg.file_message(USER, "document", "D1", csv, caption="sum the qty",
                                   file_name="stock.csv", mime_type="text/csv"))  # fmt: skip
    await h.replies(USER, 1)
    (raw,) = _tool_results(fake_openai)
    result = json.loads(raw)
    assert result["exit_code"] == 0, result
    uid, *lines = result["output"].splitlines()
    assert lines == ["name,qty", "apple,3", "pear,5"], result
    if os.geteuid() == 0 and (reachable or backend == "landlock"):
        # The command ran as the sandbox uid, never root: the inbox was handed over to it.
        assert uid == "65534", result
    assert (where / "inbox" / "made-here").exists()


async def test_bub_tools_without_fs_drops_send_file(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start(tools=["tape", "spill"])
    fake_openai.script(text("ok"))
    tg.push_update(tg.private_text(USER, "hello"))
    await h.replies(USER, 1)
    assert "send_file" not in _offered(fake_openai)
    assert "tape_info" in _offered(fake_openai)


async def test_a_workspace_rules_tools_narrow_send_file(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    (tmp_path / "narrow").mkdir()
    (tmp_path / "files").mkdir()
    rules = tmp_path / "map.json"
    rules.write_text(json.dumps({"workspaces": [
        {"match": f"telegram:{USER}", "path": str(tmp_path / "narrow"), "tools": ["tape"]},
        {"match": "telegram:*", "path": str(tmp_path / "files"), "tools": ["fs"]},
    ]}))  # fmt: skip
    h = await start(workspace_map=rules)
    fake_openai.script(text("ok"), text("ok"))
    tg.push_update(tg.private_text(USER, "hello"))
    await h.replies(USER, 1)
    assert "send_file" not in _offered(fake_openai)
    other = USER + 1
    tg.push_update(tg.private_text(other, "hello"))
    await h.replies(other, 1)
    assert "send_file" in _offered(fake_openai) and "fs_read" in _offered(fake_openai)
    assert "tape_info" not in _offered(fake_openai)
