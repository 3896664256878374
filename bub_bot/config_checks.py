"""Cross-field checks of the settings that pydantic cannot express (`Settings.check`): a
model is configured, the channels' tokens and secrets go together, the schedule windows agree,
and the files and policies named by settings (MCP servers, skills, workspace map, approvals,
fetch allowances, limits and budgets) load. Each problem is one ConfigError naming the
setting."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

from .approvals.approvers import Approvers
from .approvals.policy import ApprovalPolicy
from .errors import ConfigError
from .limits import check_priced, limits_from
from .mcp_config import load_mcp_config
from .netguard import Allowance
from .tape.context import load_selector
from .tape.urls import parse_database_url
from .workspaces import load_workspace_map

_SECRET_RE = re.compile(r"[A-Za-z0-9_-]{1,256}")


class CheckedSettings(Protocol):
    """What the checks read of `bub_bot.config.Settings` (which cannot be imported here:
    it imports this module)."""

    context_selector: str | None
    model: str
    web_token: str | None
    telegram_token: str | None
    telegram_webhook_url: str | None
    telegram_webhook_secret: str | None
    slack_bot_token: str | None
    slack_app_token: str | None
    slack_signing_secret: str | None
    schedule_grace_seconds: float
    schedule_drop_seconds: float
    mcp_config: Path | None
    approve: str
    approvers: str
    fetch_allow: list[str]
    skills_dir: Path | None
    workspace_map: Path | None
    workspace: Path

    @property
    def database(self) -> str: ...
    @property
    def database_setting(self) -> str: ...
    @property
    def model_configured(self) -> bool: ...
    @property
    def web_only(self) -> bool: ...


def check_settings(
    settings: CheckedSettings, *, require_model: bool, web_may_lack_model: bool
) -> None:
    """Raise ConfigError naming the setting at the first problem (see the module docstring).

    `web_may_lack_model`: `serve` with the web chat as its only channel starts without a
    model (the page tells a newcomer what to set)."""
    if settings.context_selector:
        try:
            load_selector(settings.context_selector)
        except ValueError as exc:
            raise ConfigError(f"BUB_CONTEXT_SELECTOR: {exc}") from None
    try:
        parse_database_url(settings.database)
    except ValueError as exc:
        raise ConfigError(f"{settings.database_setting}: {exc}") from None
    if (
        require_model
        and not settings.model_configured
        and not (web_may_lack_model and settings.web_only)
    ):
        raise ConfigError(
            "OPENAI_API_KEY is not set: set it (or OPENAI_BASE_URL for a local"
            " OpenAI-compatible server that needs no key)"
        )
    if settings.web_token is not None and len(settings.web_token) < 8:
        raise ConfigError("BUB_WEB_TOKEN must be at least 8 characters (or unset: a random one)")
    if settings.telegram_webhook_url:
        if not settings.telegram_token:
            raise ConfigError("BUB_TELEGRAM_WEBHOOK_URL is set but BUB_TELEGRAM_TOKEN is not")
        secret = settings.telegram_webhook_secret or ""
        if not _SECRET_RE.fullmatch(secret):
            raise ConfigError(
                "BUB_TELEGRAM_WEBHOOK_SECRET must be 1-256 characters of A-Za-z0-9_- in"
                " webhook mode"
            )
    if settings.telegram_token and ":" not in settings.telegram_token:
        raise ConfigError("BUB_TELEGRAM_TOKEN does not look like a bot token (<id>:<secret>)")
    if settings.slack_bot_token:
        if not settings.slack_bot_token.startswith("xoxb-"):
            raise ConfigError("BUB_SLACK_BOT_TOKEN must be a bot token starting with xoxb-")
        if settings.slack_app_token and not settings.slack_app_token.startswith("xapp-"):
            raise ConfigError("BUB_SLACK_APP_TOKEN must be an app token starting with xapp-")
        if not settings.slack_app_token and not settings.slack_signing_secret:
            raise ConfigError(
                "BUB_SLACK_APP_TOKEN (Socket Mode) or BUB_SLACK_SIGNING_SECRET (HTTP events)"
                " must be set with BUB_SLACK_BOT_TOKEN"
            )
    elif settings.slack_app_token or settings.slack_signing_secret:
        raise ConfigError("BUB_SLACK_BOT_TOKEN must be set to enable Slack")
    if (
        settings.schedule_drop_seconds
        and settings.schedule_drop_seconds < settings.schedule_grace_seconds
    ):
        raise ConfigError(
            "BUB_SCHEDULE_DROP_SECONDS must be 0 (never drop) or at least"
            " BUB_SCHEDULE_GRACE_SECONDS"
        )
    if settings.mcp_config is not None:
        load_mcp_config(settings.mcp_config)  # ConfigError: the file and the problem
    ApprovalPolicy.parse(settings.approve)  # ConfigError naming BUB_APPROVE
    Approvers.parse(settings.approvers)
    if settings.fetch_allow:
        try:
            Allowance.parse(settings.fetch_allow)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if settings.skills_dir is not None and not settings.skills_dir.expanduser().is_dir():
        raise ConfigError(f"BUB_SKILLS_DIR: {str(settings.skills_dir)!r} is not a directory")
    rules = []
    if settings.workspace_map is not None:
        # ConfigError: the rule
        rules = load_workspace_map(settings.workspace_map, settings.workspace).rules
    try:
        limits = limits_from(settings)  # the limits: one line naming one
        check_priced(limits, settings.model)
        for rule in rules:
            if rule.limits is not None:
                check_priced(limits.with_rule(rule.limits), settings.model)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
