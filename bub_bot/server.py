"""`bub-bot serve`: one aiohttp app that runs the channels, their webhooks and health checks."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from channels.base import Announces, Channel, SendsFiles

from .agent import Agent, ModelClient, ModelError, ModelReply, default_registry
from .agent.bash import install_bash
from .agent.schedule_tools import register_schedule_tools
from .agent.send_file import register_send_file
from .agent.subagent import register_subagent_tool
from .config import MODEL_MISSING, ConfigError, Settings
from .hardening import private_dir
from .http_limits import ConnectionGuard, GuardedSite
from .runtime import Runtime
from .runtime.outfiles import OutFiles
from .secrets import redact_url_passwords
from .tape import TapeStore, open_store, parse_database_url
from .tape.leases import owner_id

if TYPE_CHECKING:
    from .agent.mcp import McpManager

log = logging.getLogger("bub_bot.server")

READY_DB_TIMEOUT = 5.0
"""Seconds /readyz waits for the database before reporting it unreachable."""

NO_CHANNEL = (
    "no channel is configured: set BUB_TELEGRAM_TOKEN (Telegram) or BUB_SLACK_BOT_TOKEN with"
    " BUB_SLACK_APP_TOKEN or BUB_SLACK_SIGNING_SECRET (Slack); to try bub-bot in the terminal"
    " run `bub-bot chat`; BUB_WEB=off turned the web chat off"
)


class UnconfiguredModel(ModelClient):
    """Stands in for the model while none is configured (`serve` with only the web chat):
    every turn ends with `MODEL_MISSING` as its notice, without a network call."""

    async def complete(
        self, messages: list[dict[str, Any]], *args: Any, **kwargs: Any
    ) -> ModelReply:
        raise ModelError(
            "no model configured (OPENAI_API_KEY / OPENAI_BASE_URL unset)", MODEL_MISSING
        )


@dataclass
class Bot:
    """Everything a running bub-bot holds: store, agent, runtime and channels."""

    settings: Settings
    store: TapeStore
    agent: Agent
    runtime: Runtime
    channels: list[Channel] = field(default_factory=list)
    started: dict[str, bool] = field(default_factory=dict)
    extra_routes: list[tuple[str, str, Callable[..., Awaitable[Any]]]] = field(default_factory=list)
    metrics: Any = None
    mcp: McpManager | None = None
    """The MCP servers (`McpManager`) when BUB_MCP_CONFIG is set."""

    @classmethod
    async def open(
        cls,
        settings: Settings,
        channels: list[Channel] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> Bot:
        """Open the database and build the agent and runtime (channels are not started);
        `clock` is when jobs are due (tests move their own)."""
        try:  # before the database: BUB_HOME holds the tapes and must be private
            private_dir(settings.home)
        except OSError as exc:
            log.warning("cannot create BUB_HOME %s: %s", settings.home, exc)
        store = await open_store(settings)
        log.info(
            "store.opened kind=%s at=%s schema=v%d",
            store.kind,
            store.location,
            store.schema_version,
        )
        try:  # the default workspace ($BUB_HOME/workspace) starts empty; MCP servers run in it
            settings.workspace.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("cannot create the workspace %s: %s", settings.workspace, exc)
        model = ModelClient(settings) if settings.model_configured else UnconfiguredModel(settings)
        agent = Agent(settings, model, default_registry())
        try:
            agent.shell = await install_bash(agent.tools, settings)
        except BaseException:
            await store.close()
            raise
        channels = list(channels or [])
        # Several replicas on one PostgreSQL database share leases; SQLite grants them all.
        leases = store.leases(owner_id(), settings.lease_seconds)
        runtime = Runtime(settings, store, agent, {c.name: c for c in channels}, leases, clock)
        register_schedule_tools(agent.tools, runtime.schedules)
        if any(isinstance(c, SendsFiles) for c in channels):
            register_send_file(agent.tools, OutFiles(settings, runtime.channels))
        register_subagent_tool(agent.tools, runtime.subagents)
        if leases.shared:
            log.info("leases.shared owner=%s seconds=%g", leases.owner, settings.lease_seconds)
        bot = cls(settings, store, agent, runtime, channels)
        bot.mcp = start_mcp(settings, agent)
        from .metrics import install

        bot.metrics, route = install(
            runtime, agent, [c.name for c in channels], settings.metrics_token
        )
        bot.extra_routes.append(route)
        return bot

    async def start_channels(self) -> None:
        """Start every channel; a channel that cannot start stops the whole start."""
        for channel in self.channels:
            await channel.start(self.runtime)
            self.started[channel.name] = True
            log.info("channel.started channel=%s", channel.name)

    async def close(self) -> None:
        """Stop channels, let running turns finish (grace period), close the database."""
        for channel in self.channels:
            try:
                await channel.stop()
            except Exception:
                log.exception("channel.stop failed channel=%s", channel.name)
            self.started[channel.name] = False
        await self.runtime.shutdown()
        if self.agent.shell is not None:
            await self.agent.shell.close()  # background jobs killed, recorded on their tapes
        if self.mcp is not None:
            await self.mcp.close()  # after the turns: stdio servers terminated and reaped
        await self.agent.model.close()
        await self.store.close()


GC_THRESHOLD = (10_000, 10, 10)
"""Young collections every 10,000 allocations instead of 700: hundreds of turns at once keep
many young objects alive, and with the default every turn paid ~0.5 ms in collections that
found almost nothing (profiled: 15-25 % of the CPU of `bench/runtime_bench.py`). Objects
freed by reference counting are not affected; cycles wait a little longer."""


def tune_gc() -> None:
    """Once started: what exists now (modules, settings, the app) lives as long as the
    process, so the collector stops scanning it (`gc.freeze`), and collects less often."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def start_mcp(settings: Settings, agent: Agent) -> McpManager | None:
    """Connect the MCP servers of BUB_MCP_CONFIG in the background and offer their tools
    (None when none are configured). Turns wait a bounded time for servers still starting."""
    if settings.mcp_config is None:
        return None
    from .agent.mcp import McpManager, load_mcp_config

    servers = load_mcp_config(settings.mcp_config)
    if not servers:
        return None
    manager = McpManager(servers, settings.workspace, agent.scrub)
    agent.tools.sources.append(manager)
    manager.start()
    return manager


def build_channels(settings: Settings, first_poll: Any = None) -> list[Channel]:
    """The configured channels. Each platform library is imported only when it is configured
    (aiogram alone takes seconds to import). `first_poll`: Telegram's first long poll, sent
    already (`early_poll`)."""
    found: list[Channel] = []
    if settings.telegram_enabled:
        from channels.telegram import TelegramChannel

        found.append(TelegramChannel(settings, first_poll=first_poll))
    if settings.slack_enabled:
        from channels.slack import SlackChannel

        found.append(SlackChannel(settings))
    if settings.web_enabled:
        from channels.web import WebChannel

        found.append(WebChannel(settings))
    return found


class BotServer:
    """The HTTP side of a bot: health, readiness, metrics and channel webhooks.

    `start()` listens first, then starts the channels and resumes unfinished work, and only
    then reports ready; `stop()` reverses it (running turns get the grace period).
    """

    def __init__(self, bot: Bot, host: str | None = None, port: int | None = None) -> None:
        self.bot = bot
        self.host = bot.settings.host if host is None else host
        self.port = bot.settings.port if port is None else port
        self.ready = False
        conf = bot.settings
        self.guard = ConnectionGuard(
            max_connections=conf.http_max_connections,
            header_timeout=conf.http_header_timeout_seconds,
            body_timeout=conf.http_body_timeout_seconds,
            idle_timeout=conf.http_idle_timeout_seconds,
        )
        self.app = self._build()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        # A wildcard address is not something to open in a browser: show loopback.
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(self.host, self.host)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 address in a URL
        return f"http://{host}:{self.port}"

    def _build(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024, middlewares=[self.guard.middleware])
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        for channel in self.bot.channels:
            for method, path, handler in channel.routes():
                app.router.add_route(method, path, handler)
        for method, path, handler in self.bot.extra_routes:
            app.router.add_route(method, path, handler)
        return app

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        bot = self.bot
        body: dict[str, Any] = {
            "ok": True,
            "store": bot.store.kind,
            "database": "ok",
            "channels": {},
        }
        try:
            # A database that hangs must not hang the health check with it.
            await asyncio.wait_for(bot.store.ping(), READY_DB_TIMEOUT)
        except Exception as exc:
            cause = "timed out" if isinstance(exc, TimeoutError) else str(exc)
            # /readyz needs no token: no secret (a DSN's password) in what it shows.
            cause = redact_url_passwords(bot.agent.scrub.text(cause))
            body["ok"], body["database"] = False, f"error: {cause or type(exc).__name__}"
        now = time.monotonic()
        for channel in bot.channels:
            last = bot.runtime.last_inbound.get(channel.name)
            started = bot.started.get(channel.name, False)
            body["channels"][channel.name] = {
                "started": started,
                "last_inbound_age_seconds": None if last is None else round(now - last, 1),
            }
            body["ok"] = body["ok"] and started
        if bot.mcp is not None:
            # Shown, not part of "ok": a bot without one MCP server still serves.
            body["mcp"] = bot.mcp.status()
        shell = bot.agent.shell
        # Shown, not part of "ok": a bot without bash still serves.
        if shell is not None:
            body["bash"] = {"sandbox": shell.availability.describe()}
        elif "bash" in bot.agent.tools.missing:
            body["bash"] = {"sandbox": "unavailable", "why": bot.agent.tools.missing["bash"]}
        body["ok"] = body["ok"] and self.ready
        return web.json_response(body, status=200 if body["ok"] else 503)

    async def start(self) -> None:
        self._runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,
            keepalive_timeout=self.bot.settings.http_idle_timeout_seconds,
        )
        await self._runner.setup()
        site = GuardedSite(self._runner, self.host, self.port, self.guard)
        await site.start()
        if self.port == 0:
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        await self.bot.start_channels()
        await self.bot.runtime.start()
        # After the channels started (Telegram's first poll is not delayed): the SDK loads in a
        # worker thread, so the first turn does not import it on the event loop.
        self.bot.agent.model.preload()
        self.ready = True
        log.info(
            "serving on %s:%d channels=%s",
            self.host,
            self.port,
            ",".join(c.name for c in self.bot.channels) or "-",
        )

    async def stop(self) -> None:
        self.ready = False
        await self.bot.close()
        if self._runner is not None:
            await self._runner.cleanup()


async def early_poll(settings: Settings) -> Any:
    """Telegram's first long poll, sent before anything it does not need is loaded (aiogram,
    the agent, the runtime): see channels/telegram_early.py. Only with Telegram polling and
    one process (SQLite: with several replicas the poll needs the polling lease)."""
    if not settings.telegram_enabled or settings.telegram_webhook_url:
        return None
    if parse_database_url(settings.database).kind != "sqlite" or not settings.telegram_token:
        return None
    from channels.telegram_early import FirstPoll

    return await FirstPoll.begin(settings.telegram_token, settings.telegram_api_base)


async def serve(settings: Settings) -> int:
    """Run until SIGTERM/SIGINT; exit code 0 on a clean stop, 2 when nothing is configured."""
    first_poll = await early_poll(settings)
    try:
        return await _serve(settings, first_poll)
    finally:
        if first_poll is not None:
            await first_poll.close()  # unless the channel took it (then this does nothing)


async def _serve(settings: Settings, first_poll: Any) -> int:
    channels = build_channels(settings, first_poll)
    if not channels:
        log.error(NO_CHANNEL)
        return 2
    try:
        bot = await Bot.open(settings, channels)
    except ConfigError as exc:  # BUB_SHELL_SANDBOX forced to a backend that cannot work
        log.error("start failed: %s", exc)
        return 2
    server = BotServer(bot)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except Exception as exc:
        # A channel that cannot start (bad token, unreachable API) is one line, not a trace.
        log.error("start failed: %s", exc)
        await server.stop()
        return 2 if isinstance(exc, ConfigError) else 1
    tune_gc()
    if not settings.model_configured:
        log.warning("no model configured: the web chat answers with how to set one up")
    for channel in channels:
        if isinstance(channel, Announces):
            # stdout, not the log: the one place a generated web token is shown.
            print(channel.announce(server.url), flush=True)
    await stop.wait()
    log.info("shutdown requested")
    await server.stop()
    log.info("stopped")
    return 0
