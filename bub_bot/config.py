"""All settings in one place: environment variables and `.env`, validated at start."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
_SECRET_RE = re.compile(r"^[A-Za-z0-9_-]{1,256}$")


CsvList = Annotated[list[str], NoDecode]


class ConfigError(ValueError):
    """A setting is missing or invalid; the message names the variable."""


def _csv(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list | tuple | set):
        return [str(v).strip() for v in value if str(v).strip()]
    return [part.strip() for part in str(value).split(",") if part.strip()]


class Settings(BaseSettings):
    """bub-bot's configuration. Every field maps to `BUB_<NAME>` unless its alias says else."""

    model_config = SettingsConfigDict(
        env_prefix="BUB_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        populate_by_name=True,
    )

    # storage
    home: Path = Field(default=Path("~/.bub-bot"))
    database_url: str | None = None
    workspace: Path = Field(default=Path("."))

    # model
    model: str = "gpt-4o-mini"
    openai_api_key: str | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_API_KEY", "BUB_OPENAI_API_KEY")
    )
    openai_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_BASE_URL", "BUB_OPENAI_BASE_URL")
    )
    model_timeout_seconds: float = Field(default=120.0, gt=0)
    model_retries: int = Field(default=3, ge=0, le=10)
    max_steps: int = Field(default=20, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    system_prompt: str | None = None
    spill_threshold: int = Field(default=4096, ge=0)
    handoff_summary_timeout_seconds: float = Field(default=60.0, gt=0)

    # runtime
    max_concurrent_turns: int = Field(default=32, ge=1)
    resume_window_seconds: float = Field(default=900.0, ge=0)
    shutdown_grace_seconds: float = Field(default=20.0, ge=0)

    # server
    host: str = "0.0.0.0"
    port: int = Field(
        default=8080, ge=0, le=65535, validation_alias=AliasChoices("PORT", "BUB_PORT")
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    metrics_token: str | None = None

    # telegram
    telegram_token: str | None = None
    telegram_api_base: str | None = None
    telegram_allow_users: CsvList = Field(default_factory=list)
    telegram_allow_chats: CsvList = Field(default_factory=list)
    telegram_webhook_url: str | None = None
    telegram_webhook_secret: str | None = None
    telegram_max_image_bytes: int = Field(default=5_000_000, ge=0)

    # slack
    slack_bot_token: str | None = None
    slack_app_token: str | None = None
    slack_signing_secret: str | None = None
    slack_api_url: str | None = None
    slack_allow_users: CsvList = Field(default_factory=list)
    slack_allow_channels: CsvList = Field(default_factory=list)
    slack_require_mention: bool = False
    slack_allow_bots: bool = False
    slack_command_prefix: str = "bub-"
    slack_working_indicator: Literal["auto", "status", "reaction", "none"] = "auto"

    @field_validator(
        "telegram_allow_users",
        "telegram_allow_chats",
        "slack_allow_users",
        "slack_allow_channels",
        mode="before",
    )
    @classmethod
    def _split_lists(cls, value: object) -> list[str]:
        return _csv(value)

    # -- derived ------------------------------------------------------------------------------
    @property
    def database_path(self) -> str:
        """The SQLite file: `BUB_DATABASE_URL` (sqlite:///path or a path) or `BUB_HOME/bub.db`."""
        url = self.database_url
        if url:
            if url.startswith("sqlite:///"):
                return url[len("sqlite:///") :]
            if url.startswith("sqlite://"):
                return url[len("sqlite://") :]
            return url
        return str(self.home.expanduser() / "bub.db")

    @property
    def telegram_enabled(self) -> bool:
        return bool(self.telegram_token)

    @property
    def slack_enabled(self) -> bool:
        return bool(self.slack_bot_token)

    def check(self, *, require_model: bool = True) -> Settings:
        """Cross-field checks that pydantic cannot express; raises ConfigError naming the var."""
        url = self.database_url
        if url and "://" in url and not url.startswith("sqlite:"):
            raise ConfigError(
                "BUB_DATABASE_URL: only sqlite:///path (or a plain file path) is supported"
            )
        if require_model and not self.openai_api_key and not self.openai_base_url:
            raise ConfigError(
                "OPENAI_API_KEY is not set: set it (or OPENAI_BASE_URL for a local"
                " OpenAI-compatible server that needs no key)"
            )
        if self.telegram_webhook_url:
            if not self.telegram_token:
                raise ConfigError("BUB_TELEGRAM_WEBHOOK_URL is set but BUB_TELEGRAM_TOKEN is not")
            secret = self.telegram_webhook_secret or ""
            if not _SECRET_RE.match(secret):
                raise ConfigError(
                    "BUB_TELEGRAM_WEBHOOK_SECRET must be 1-256 characters of A-Za-z0-9_- in"
                    " webhook mode"
                )
        if self.telegram_token and ":" not in self.telegram_token:
            raise ConfigError("BUB_TELEGRAM_TOKEN does not look like a bot token (<id>:<secret>)")
        if self.slack_bot_token:
            if not self.slack_bot_token.startswith("xoxb-"):
                raise ConfigError("BUB_SLACK_BOT_TOKEN must be a bot token starting with xoxb-")
            if self.slack_app_token and not self.slack_app_token.startswith("xapp-"):
                raise ConfigError("BUB_SLACK_APP_TOKEN must be an app token starting with xapp-")
            if not self.slack_app_token and not self.slack_signing_secret:
                raise ConfigError(
                    "BUB_SLACK_APP_TOKEN (Socket Mode) or BUB_SLACK_SIGNING_SECRET (HTTP events)"
                    " must be set with BUB_SLACK_BOT_TOKEN"
                )
        elif self.slack_app_token or self.slack_signing_secret:
            raise ConfigError("BUB_SLACK_BOT_TOKEN must be set to enable Slack")
        return self


def _env_name(loc: tuple) -> str:
    field = str(loc[0]) if loc else "?"
    info = Settings.model_fields.get(field)
    if info is not None and info.validation_alias is not None:
        choices = getattr(info.validation_alias, "choices", None)
        if choices:
            return str(choices[0])
    if field.isupper():
        return field
    return f"BUB_{field.upper()}"


def load_settings(*, require_model: bool = True, **overrides: object) -> Settings:
    """Read and check the settings; any problem raises ConfigError with one line.

    `require_model=False` for commands that never call the model (`tapes`, `doctor`).
    """
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(f"invalid setting {_env_name(err['loc'])}: {err['msg']}") from None
    except SettingsError as exc:
        raise ConfigError(f"invalid settings: {exc}") from None
    return settings.check(require_model=require_model)
