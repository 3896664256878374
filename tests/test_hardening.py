"""Start-up hardening: the bot's environment is not readable by its own children, BUB_HOME
and the tape database are private, doctor warns about a readable home."""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bub_bot.doctor import doctor
from bub_bot.server import Bot

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import os, subprocess, sys
sys.path.insert(0, {root!r})
if sys.argv[1] == "harden":
    from hardening import no_dump
    assert no_dump()
reader = "import os, sys\\ntry:\\n    open(f'/proc/{{os.getppid()}}/environ', 'rb').read()\\n    print('READ')\\nexcept PermissionError:\\n    print('DENIED')"
print(subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True).stdout.strip())
"""


def _as_bot_user() -> dict:
    """Run the 'bot' as an ordinary user: as root, nobody (root may read anything); the
    module is stdlib-only and copied where nobody can read it."""
    if os.geteuid() != 0:
        return {}

    def drop() -> None:
        os.setgid(65534)
        os.setgroups([])
        os.setuid(65534)

    return {"preexec_fn": drop}


@pytest.mark.parametrize("mode", ["harden", "plain"])
def test_a_child_of_the_bot_cannot_read_its_environment(mode: str) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "BUB_TELEGRAM_TOKEN": "SECRET-IN-ENVIRON"}
    where = Path(tempfile.mkdtemp(prefix="bub-harden-"))  # pytest's tmp is root's only
    shutil.copy(ROOT / "bub_bot" / "hardening.py", where / "hardening.py")
    for path in (where, where / "hardening.py"):
        os.chmod(path, 0o755)
    python = (
        "/usr/bin/python3"
        if os.geteuid() == 0 and Path("/usr/bin/python3").exists()
        else sys.executable
    )
    out = subprocess.run(
        [python, "-c", CHILD.format(root=str(where)), mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd="/",
        **_as_bot_user(),
    )
    shutil.rmtree(where)
    assert out.returncode == 0, out.stderr
    # The plain run is the control: the same reader succeeds without the hardening.
    assert out.stdout.strip() == ("DENIED" if mode == "harden" else "READ")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_home_and_database_files_are_private(settings, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        home = tmp_path / "fresh-home"
        bot = await Bot.open(settings(home=home, workspace=home / "workspace"))
        try:
            await bot.store.list_tapes()
        finally:
            await bot.close()
    finally:
        os.umask(old)
    assert _mode(home) == 0o700
    files = [p for p in home.iterdir() if p.name.startswith("bub.db")]
    assert files and all(_mode(p) == 0o600 for p in files), [(p, _mode(p)) for p in files]


async def test_an_existing_readable_database_is_tightened_and_doctor_warns(
    settings, tmp_path: Path
) -> None:
    home = tmp_path / "old-home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    (home / "bub.db").touch(mode=0o644)
    os.chmod(home / "bub.db", 0o644)
    conf = settings(home=home, workspace=home / "workspace")
    out = io.StringIO()
    await doctor(conf, out)
    assert _mode(home / "bub.db") == 0o600
    assert f"warn  home      {home} is mode 0755" in out.getvalue()
    os.chmod(home, 0o700)
    out = io.StringIO()
    await doctor(conf, out)
    assert "warn  home" not in out.getvalue()
