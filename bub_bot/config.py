"""All settings in one place: environment variables and `.env`, validated at start."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AliasChoices,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from .config_checks import check_settings
from .config_values import check_networks, csv_list, parse_rate, uid_range, workspace_uid
from .errors import ConfigError
from .schedules.times import zone_named
from .tape.urls import parse_database_url
from .toolgroups import TOOL_GROUPS, check_groups

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
MODEL_MISSING = (
    "No model is configured yet, so I cannot answer. Set OPENAI_API_KEY (your API key), or"
    " OPENAI_BASE_URL for a local OpenAI-compatible server such as llama.cpp or Ollama, in the"
    " .env file in the directory you run bub-bot from (see .env.example), then restart"
    " bub-bot serve."
)
"""What the web chat says (page and answer) while `serve` runs without a model."""


CsvList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    """bub-bot's configuration. Every field maps to `BUB_<NAME>` unless its alias says else."""

    model_config = SettingsConfigDict(
        env_prefix="BUB_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        populate_by_name=True,
    )
    _web_token_generated: bool = PrivateAttr(default=False)

    # storage
    home: Path = Field(default=Path("~/.bub-bot"))
    database_url: str | None = None
    # PaaS add-ons (Heroku Postgres and the like) set DATABASE_URL: used when
    # BUB_DATABASE_URL is unset or empty.
    paas_database_url: str | None = Field(
        default=None, validation_alias=AliasChoices("DATABASE_URL")
    )
    database_pool_size: int = Field(default=10, ge=1, le=1000)
    # Unset: $BUB_HOME/workspace, not the working directory (where the quick start keeps .env).
    workspace: Path = Field(default=None, validate_default=False)  # type: ignore[assignment]
    # Workspace per conversation: a JSON file of rules (see bub_bot/workspaces.py)
    workspace_map: Path | None = None
    # MCP servers: a JSON file in the mcpServers format (see bub_bot/mcp_config.py)
    mcp_config: Path | None = None
    # Operator-wide skills (<dir>/<name>/SKILL.md); a workspace's own skills/ wins a clash.
    skills_dir: Path | None = None

    # model
    model: str = "gpt-4o-mini"
    openai_api_key: str | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_API_KEY", "BUB_OPENAI_API_KEY")
    )
    openai_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_BASE_URL", "BUB_OPENAI_BASE_URL")
    )
    model_timeout_seconds: float = Field(default=120.0, gt=0)
    """The most one model step may take, retries and a streamed step's fallback included."""
    model_retries: int = Field(default=3, ge=0, le=10)
    max_steps: int = Field(default=20, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    system_prompt: str | None = None
    spill_threshold: int = Field(default=4096, ge=0)
    handoff_summary_timeout_seconds: float = Field(default=60.0, gt=0)

    # file tools (bub_bot/workspace_files.py, bub_bot/agent/fs_tools.py)
    fs_write_max_bytes: int = Field(default=1024 * 1024, ge=1, le=1024**3)
    """The largest file fs.write / fs.edit may leave (bytes, UTF-8)."""
    fs_allow_hardlinks: bool = False
    """Hard-linked files are refused by the file tools unless this is on (another name of
    the same file may be a secret file)."""

    # web.fetch (bub_bot/agent/web_fetch.py)
    fetch_timeout_seconds: float = Field(default=20.0, gt=0, le=600)
    """The most one fetch may take, redirects included."""
    fetch_max_bytes: int = Field(default=5 * 1024 * 1024, ge=1024, le=1024**3)
    """The most of a response body that is read (after decompression); the rest is cut."""
    fetch_allow: CsvList = Field(default_factory=list)
    """Hosts, IP addresses and CIDRs (with :port or :*) web.fetch may reach although they
    are not public (bub_bot/netguard.py)."""

    # tools and the bash sandbox (issue 19 §2, §5; bub_bot/agent/bash.py, agent/sandbox/)
    tools: CsvList = Field(default_factory=lambda: list(TOOL_GROUPS))
    """Tool groups the model gets (a workspace rule's `tools` narrows them)."""
    shell_sandbox: Literal["auto", "bwrap", "landlock", "none"] = "auto"
    shell_bwrap: str = "bwrap"
    """The bubblewrap binary (a name on PATH or a path)."""
    shell_max_output: int = Field(default=256 * 1024, ge=1024, le=64 * 1024 * 1024)
    shell_timeout_max: float = Field(default=1800.0, gt=0, le=86400)
    shell_cpu_seconds: int = Field(default=300, ge=1)
    shell_memory_mb: int = Field(default=4096, ge=64)
    shell_file_mb: int = Field(default=1024, ge=1)
    shell_nofile: int = Field(default=1024, ge=16)
    shell_nproc: int = Field(default=256, ge=8)
    shell_tmp_mb: int = Field(default=256, ge=1)
    shell_uid: int = Field(default=65534, ge=1, le=2**31 - 1)
    """The uid commands run as when the bot runs as root."""
    shell_max_jobs: int = Field(default=4, ge=0, le=100)
    """Background jobs running at once per conversation."""
    # a uid per workspace for the sandbox (`workspace_uid`, bub_bot/config_values.py)
    shell_uids: str = ""
    """"LO-HI": as root, each workspace's commands run as their own uid of this range (empty:
    all share BUB_SHELL_UID)."""

    # approvals in chat (bub_bot/approvals)
    approve: str = ""
    """Per tool or group `allow|ask|deny` (`bash=ask,web.fetch=allow,mcp.github.*=ask`)."""
    approvers: str = "requester"
    """Who may decide: `requester`, `*`, `<channel>:<user id>` (comma-separated)."""
    approval_timeout_seconds: float = Field(default=900.0, gt=0, le=7 * 86400)

    # runtime
    max_concurrent_turns: int = Field(default=32, ge=1)
    resume_window_seconds: float = Field(default=900.0, ge=0)
    shutdown_grace_seconds: float = Field(default=20.0, ge=0)
    lease_seconds: float = Field(default=15.0, ge=1, le=3600)
    """How long a replica's claim on a session lasts without renewal (PostgreSQL, several
    replicas): a dead replica's sessions are taken over after about this long."""

    # time and schedules (bub_bot/schedules)
    timezone: str = "UTC"
    """IANA zone for times people read and give without a zone (schedules, calendar days)."""
    schedule_max_per_session: int = Field(default=20, ge=0, le=10_000)
    schedule_min_interval_seconds: float = Field(default=300.0, ge=0)
    """The shortest gap between two runs of a recurring job."""
    schedule_grace_seconds: float = Field(default=3600.0, ge=0)
    """A job that fires later than this after its time (the bot was down) says it is late."""
    schedule_drop_seconds: float = Field(default=86400.0, ge=0)
    """A job later than this is not run; the conversation gets a note instead (0: never)."""
    # limits, budgets and usage (bub_bot/limits.py, bub_bot/budgets)
    limit_user: str = ""
    """Messages per person: `20/min,200/day` (minute, hour, day, month; calendar windows)."""
    limit_conversation: str = ""
    """Messages per conversation (session), as BUB_LIMIT_USER."""
    budget_user: str = ""
    """Tokens (input + output) per person: `200000/day`, `5M/month`, or dollars `$5/day`."""
    budget_conversation: str = ""
    budget_total: str = ""
    """The whole bot's budget (admins too)."""
    model_prices: str = ""
    """`model=in/out` dollars per 1 M tokens, comma-separated: `gpt-4o=2.5/10`."""
    admins: str = ""
    """`slack:U123,telegram:42`: exempt from the per-person limits (not the total); /usage all."""
    # subagents (bub_bot/agent/subagent.py, bub_bot/runtime/subagents.py)
    subagent_max_depth: int = Field(default=2, ge=0, le=5)
    """How deep subagents may nest (a conversation's turn is depth 0; 0: no subagents)."""
    subagent_max_concurrent: int = Field(default=4, ge=1, le=64)
    """Subagents running at once per conversation (background ones included)."""
    subagent_max_steps: int = Field(default=8, ge=1, le=100)
    """Model steps of one subagent run."""
    subagent_timeout_seconds: float = Field(default=300.0, gt=0, le=86_400)
    """The most one subagent run may take; past it, it stops and says so."""
    subagent_models: CsvList = Field(default_factory=list)
    """Models a subagent may be asked to use besides BUB_MODEL (empty: only BUB_MODEL)."""
    context_selector: str | None = None
    """`module:function` turning entries into model messages instead of the default."""
    # streaming replies: the answer appears while the model writes it
    stream: bool = True
    stream_interval_ms: int | None = Field(default=None, ge=0, le=60_000)
    """Time between two updates of a streamed reply in one conversation; unset: each
    platform's default (README). Never faster than the platform's own send limits."""

    # server
    host: str = "0.0.0.0"
    port: int = Field(
        default=8080, ge=0, le=65535, validation_alias=AliasChoices("PORT", "BUB_PORT")
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    metrics_token: str | None = None

    # HTTP connection limits (bub_bot/http_limits.py): slow and idle clients are bounded
    http_max_connections: int = Field(default=1000, ge=8, le=1_000_000)
    http_header_timeout_seconds: float = Field(default=10.0, gt=0, le=3600)
    http_body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    http_idle_timeout_seconds: float = Field(default=75.0, gt=0, le=3600)
    web_max_streams_per_client: int = Field(default=32, ge=1, le=10_000)

    # web chat and tape viewer (channels/web)
    web: bool = True
    web_token: str | None = None
    web_viewer: bool = True
    # web login cookie and proxies (channels/web/auth.py, forwarded.py)
    web_login_max_age_seconds: int = Field(default=7 * 24 * 3600, ge=60, le=400 * 24 * 3600)
    web_cookie_secure: bool = False
    trusted_proxies: CsvList = Field(
        default_factory=lambda: [
            "127.0.0.0/8",
            "::1/128",
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "fc00::/7",
        ]
    )

    # telegram
    telegram_token: str | None = None
    telegram_api_base: str | None = None
    telegram_allow_users: CsvList = Field(default_factory=list)
    telegram_allow_chats: CsvList = Field(default_factory=list)
    telegram_webhook_url: str | None = None
    telegram_webhook_secret: str | None = None
    telegram_max_image_bytes: int = Field(default=5_000_000, ge=0)
    # Telegram's send limits (bot-wide, per chat, per group), as `parse_rate` reads them.
    telegram_rate_global: str = "30/s"
    telegram_rate_chat: str = "1/s"
    telegram_rate_group: str = "20/min"

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
    slack_rate_channel: str = "1/s"

    # Files and voice (issue 24): attachments saved under the workspace's inbox/
    attachment_max_bytes: int = Field(default=20 * 1024 * 1024, ge=1024, le=2 * 1024**3)
    attachment_inline_chars: int = Field(default=20_000, ge=0, le=1_000_000)
    attachment_image_max_bytes: int = Field(default=5_000_000, ge=0)
    model_images: bool = True
    transcribe_model: str | None = "whisper-1"
    transcribe_max_seconds: float = Field(default=900.0, gt=0)
    slack_thread_history: int = Field(default=50, ge=0, le=1000)

    @field_validator("transcribe_model", mode="before")
    @classmethod
    def _transcribe_off(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("", "off", "none", "0"):
            return None
        return value

    @field_validator(
        "telegram_rate_global", "telegram_rate_chat", "telegram_rate_group", "slack_rate_channel"
    )
    @classmethod
    def _check_rate(cls, value: str) -> str:
        parse_rate(value)
        return value

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, value: list[str]) -> list[str]:
        if not value:
            return list(TOOL_GROUPS)  # BUB_TOOLS= (empty): the default
        if value == ["none"]:
            return []
        return check_groups(value, "BUB_TOOLS")

    @field_validator("shell_uids")
    @classmethod
    def _check_shell_uids(cls, value: str) -> str:
        uid_range(value)  # ValueError saying what is wrong
        return value.strip()

    @property
    def shell_uid_range(self) -> tuple[int, int] | None:
        """BUB_SHELL_UIDS as (LO, HI), None when unset."""
        return uid_range(self.shell_uids)

    def shell_uid_for(self, workspace: Path) -> int:
        """The uid `workspace`'s commands run as when the bot runs as root."""
        return workspace_uid(workspace, self.shell_uid, self.shell_uid_range)

    @field_validator("timezone")
    @classmethod
    def _check_timezone(cls, value: str) -> str:
        zone_named(value)  # ValueError naming the zone
        return value

    @field_validator(
        "mcp_config", "workspace_map", "skills_dir", "stream_interval_ms", mode="before"
    )
    @classmethod
    def _unset_if_empty(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _default_workspace(self) -> Settings:
        if self.workspace is None:
            self.workspace = self.home.expanduser() / "workspace"
        return self

    @field_validator(
        "telegram_allow_users",
        "telegram_allow_chats",
        "slack_allow_users",
        "slack_allow_channels",
        "fetch_allow",
        "trusted_proxies",
        "tools",
        "subagent_models",
        mode="before",
    )
    @classmethod
    def _split_lists(cls, value: object) -> list[str]:
        return csv_list(value)

    @field_validator("trusted_proxies")
    @classmethod
    def _check_proxies(cls, value: list[str]) -> list[str]:
        return check_networks(value)

    # -- derived ------------------------------------------------------------------------------
    @property
    def database(self) -> str:
        """The tape database URL: `BUB_DATABASE_URL`, else `DATABASE_URL`, else the SQLite
        file `BUB_HOME/bub.db` (as sqlite:///path)."""
        url = (self.database_url or "").strip() or (self.paas_database_url or "").strip()
        return url or f"sqlite:///{self.home.expanduser() / 'bub.db'}"

    @property
    def database_setting(self) -> str:
        """The variable `database` came from, for messages."""
        if (self.database_url or "").strip():
            return "BUB_DATABASE_URL"
        return "DATABASE_URL" if (self.paas_database_url or "").strip() else "BUB_HOME"

    @property
    def database_path(self) -> str:
        """The SQLite file of `database`; for PostgreSQL the URL itself (it has a `://`)."""
        parsed = parse_database_url(self.database)
        return parsed.target

    @property
    def telegram_enabled(self) -> bool:
        return bool(self.telegram_token)

    @property
    def slack_enabled(self) -> bool:
        return bool(self.slack_bot_token)

    @property
    def web_enabled(self) -> bool:
        return self.web

    @property
    def web_only(self) -> bool:
        """The web chat is the only channel `serve` would start."""
        return self.web and not self.telegram_enabled and not self.slack_enabled

    @property
    def model_configured(self) -> bool:
        return bool(self.openai_api_key or self.openai_base_url)

    @property
    def web_token_generated(self) -> bool:
        """True when `with_web_token()` made the token up (it is then printed in the URL)."""
        return self._web_token_generated

    def with_web_token(self) -> Settings:
        """These settings with a random `web_token` when none is set (Jupyter's rule)."""
        if self.web_token or not self.web:
            return self
        made = self.model_copy(update={"web_token": secrets.token_urlsafe(32)})
        made._web_token_generated = True
        return made

    def check(self, *, require_model: bool = True, web_may_lack_model: bool = False) -> Settings:
        """Cross-field checks that pydantic cannot express; raises ConfigError naming the var.

        `web_may_lack_model`: `serve` with the web chat as its only channel starts without a
        model (the page tells a newcomer what to set)."""
        check_settings(self, require_model=require_model, web_may_lack_model=web_may_lack_model)
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


def load_settings(
    *, require_model: bool = True, web_may_lack_model: bool = False, **overrides: object
) -> Settings:
    """Read and check the settings; any problem raises ConfigError with one line.

    `require_model=False` for commands that never call the model (`tapes`, `doctor`);
    `web_may_lack_model=True` for `serve` (see `Settings.check`).
    """
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(f"invalid setting {_env_name(err['loc'])}: {err['msg']}") from None
    except SettingsError as exc:
        raise ConfigError(f"invalid settings: {exc}") from None
    return settings.check(require_model=require_model, web_may_lack_model=web_may_lack_model)
