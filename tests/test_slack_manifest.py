"""The Slack app manifest declares a slash command for every chat command bub-bot knows."""

from __future__ import annotations

import re
from pathlib import Path

from bub_bot.commands import COMMANDS
from bub_bot.config import Settings

MANIFEST = Path(__file__).resolve().parents[1] / "slack-manifest.yml"


def test_manifest_declares_every_command_with_the_default_prefix() -> None:
    prefix = Settings.model_fields["slack_command_prefix"].default
    declared = re.findall(r"^\s*- command: /(\S+)\s*$", MANIFEST.read_text(), re.MULTILINE)
    assert sorted(declared) == sorted(f"{prefix}{name}" for name in COMMANDS)
