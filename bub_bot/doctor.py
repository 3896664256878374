"""`bub-bot doctor`: check each configured part once, one line each, with a fix on failure."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TextIO

import aiohttp

from .config import DEFAULT_OPENAI_BASE_URL, Settings
from .hardening import readable_by_others
from .logs import RedactSecrets
from .secrets import known_secrets
from .tape import open_store, parse_database_url

TIMEOUT = aiohttp.ClientTimeout(total=15)
DEFAULT_TELEGRAM_API = "https://api.telegram.org"
DEFAULT_SLACK_API = "https://slack.com/api/"


@dataclass
class Result:
    """One check's outcome: `detail` on success, `detail` + `fix` on failure."""

    ok: bool
    detail: str
    fix: str = ""


async def check_storage(settings: Settings) -> Result:
    """The tape database: connect (and create or upgrade the schema), the schema version, and
    a write/read round trip in a transaction that is rolled back."""
    url = parse_database_url(settings.database)
    if url.kind == "sqlite":
        fix = "make BUB_HOME (or BUB_DATABASE_URL) point to a writable place"
    else:
        fix = (
            f"check {settings.database_setting} (host, port, user, password, database name)"
            " and that the server accepts connections from here"
        )
    try:
        async with open_store(settings) as store:
            await store.ping()
            await store.probe()
            tapes = len(await store.list_tapes())
            version = store.schema_version
    except Exception as exc:  # any failure is the finding; the message names where
        return Result(False, str(exc) or type(exc).__name__, fix)
    return Result(
        True,
        f"{url.kind} {url.display}: connected, schema v{version}, write/read ok,"
        f" {tapes} live tapes",
    )


async def check_model(settings: Settings) -> Result:
    import openai

    base = settings.openai_base_url or DEFAULT_OPENAI_BASE_URL
    if not settings.openai_api_key and not settings.openai_base_url:
        return Result(
            False,
            "OPENAI_API_KEY is not set",
            "set OPENAI_API_KEY (or OPENAI_BASE_URL for a local server)",
        )
    client = openai.AsyncOpenAI(
        api_key=settings.openai_api_key or "not-needed", base_url=base, timeout=15, max_retries=0
    )
    try:
        try:
            models = [m.id async for m in client.models.list()]
        except openai.AuthenticationError:
            return Result(False, f"{base} rejected the API key", "check OPENAI_API_KEY")
        except openai.APIConnectionError as exc:
            return Result(
                False, f"cannot reach {base}: {exc}", "check OPENAI_BASE_URL and the network"
            )
        except openai.APIStatusError:
            models = []  # some servers have no model list: ask the model itself below
        if models:
            if settings.model in models:
                return Result(True, f"{base} reachable, model {settings.model!r} listed")
            return Result(
                False,
                f"model {settings.model!r} is not served by {base}",
                f"set BUB_MODEL to one of: {', '.join(sorted(models)[:8])}",
            )
        await client.chat.completions.create(
            model=settings.model, messages=[{"role": "user", "content": "ping"}], max_tokens=1
        )
        return Result(True, f"{base} reachable, model {settings.model!r} answered")
    except openai.NotFoundError:
        return Result(False, f"model {settings.model!r} is not served by {base}", "check BUB_MODEL")
    except openai.AuthenticationError:
        return Result(False, f"{base} rejected the API key", "check OPENAI_API_KEY")
    except openai.APIConnectionError as exc:
        return Result(False, f"cannot reach {base}: {exc}", "check OPENAI_BASE_URL and the network")
    except openai.APIStatusError as exc:
        return Result(
            False, f"{base} answered HTTP {exc.status_code}", "check BUB_MODEL and OPENAI_BASE_URL"
        )
    finally:
        await client.close()


async def check_telegram(settings: Settings) -> Result:
    base = (settings.telegram_api_base or DEFAULT_TELEGRAM_API).rstrip("/")
    token = settings.telegram_token or ""
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            async with http.post(f"{base}/bot{token}/getMe") as resp:
                me = await resp.json(content_type=None)
            if not me.get("ok"):
                return Result(
                    False,
                    f"getMe failed: {me.get('description', resp.status)}",
                    "check BUB_TELEGRAM_TOKEN (from @BotFather)",
                )
            name = f"@{me['result'].get('username')}"
            if not settings.telegram_webhook_url:
                return Result(True, f"getMe ok as {name} (long polling)")
            async with http.post(f"{base}/bot{token}/getWebhookInfo") as resp:
                info = (await resp.json(content_type=None)).get("result", {})
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return Result(
            False, f"cannot reach {base}: {exc}", "check BUB_TELEGRAM_API_BASE and the network"
        )
    pending = info.get("pending_update_count", 0)
    error = info.get("last_error_message")
    if info.get("url") != settings.telegram_webhook_url:
        return Result(
            False,
            f"getMe ok as {name}, but the webhook is {info.get('url') or 'not set'!r}",
            "start bub-bot serve (it sets the webhook) or fix BUB_TELEGRAM_WEBHOOK_URL",
        )
    detail = f"getMe ok as {name}, webhook set, {pending} pending updates"
    if error:
        return Result(
            False, f"{detail}, last error: {error}", "make the webhook URL reachable over HTTPS"
        )
    return Result(True, detail)


async def check_slack(settings: Settings) -> Result:
    base = settings.slack_api_url or DEFAULT_SLACK_API
    if not base.endswith("/"):
        base += "/"
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            headers = {"Authorization": f"Bearer {settings.slack_bot_token}"}
            async with http.post(f"{base}auth.test", headers=headers) as resp:
                auth = await resp.json(content_type=None)
            if not auth.get("ok"):
                return Result(
                    False, f"auth.test failed: {auth.get('error')}", "check BUB_SLACK_BOT_TOKEN"
                )
            detail = f"auth.test ok in {auth.get('team')} as {auth.get('user')}"
            if not settings.slack_app_token:
                return Result(True, f"{detail} (HTTP events at /slack/events)")
            headers = {"Authorization": f"Bearer {settings.slack_app_token}"}
            async with http.post(f"{base}apps.connections.open", headers=headers) as resp:
                opened = await resp.json(content_type=None)
            if not opened.get("ok"):
                return Result(
                    False,
                    f"{detail}, but Socket Mode failed: {opened.get('error')}",
                    "check BUB_SLACK_APP_TOKEN (connections:write) and that Socket Mode is on",
                )
            async with http.ws_connect(opened["url"]) as ws:
                hello = await ws.receive_json(timeout=10)
            if hello.get("type") != "hello":
                return Result(
                    False, f"{detail}, Socket Mode said {hello.get('type')!r}", "retry in a minute"
                )
            return Result(True, f"{detail}, Socket Mode connection opens")
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return Result(
            False, f"cannot reach {base}: {exc}", "check BUB_SLACK_API_URL and the network"
        )


async def check_mcp(settings: Settings) -> list[tuple[str, Result]]:
    """Connect each server of BUB_MCP_CONFIG once (all at the same time) and list its tools."""
    if settings.mcp_config is None:
        return []
    from .agent.mcp import load_mcp_config, probe_server

    servers = load_mcp_config(settings.mcp_config)
    probes = await asyncio.gather(*(probe_server(s, settings.workspace) for s in servers))
    checked = []
    for server, (ok, detail) in zip(servers, probes, strict=True):
        stdio = server.transport == "stdio"
        keys = '"command", "args" and "env"' if stdio else '"url" and "headers"'
        fix = f"check {keys} of {server.name!r} in {settings.mcp_config}"
        if stdio:
            fix += f", and that the command runs by hand in {settings.workspace}"
        checked.append((f"mcp:{server.name}", Result(ok, detail, fix)))
    return checked


async def check_bash(settings: Settings) -> Result | None:
    """Which sandbox bash commands get (None: bash turned off in BUB_TOOLS)."""
    if "bash" not in settings.tools:
        return None
    import tempfile
    from pathlib import Path

    from .agent.bash import probe_uid
    from .agent.sandbox import probe

    found = await probe(
        settings.shell_sandbox,
        settings.shell_bwrap,
        Path(tempfile.gettempdir()) / "bub-sandbox",
        probe_uid(settings),
    )
    if found.backend is None:
        off = "" if settings.shell_sandbox != "auto" else " (bash is not offered)"
        return Result(False, found.why_missing() + off, "see README 'Acting tools and the sandbox'")
    return Result(True, f"sandbox {found.describe()}", "")


async def doctor(settings: Settings, out: TextIO | None = None) -> int:
    """Run the checks in order; exit 0 only when every configured part passes."""
    out = out or sys.stdout
    print("ok    settings  parsed", file=out)
    checks: list[tuple[str, Callable[[Settings], Awaitable[Result]]]] = [
        ("storage", check_storage),
        ("model", check_model),
    ]
    if settings.telegram_enabled:
        checks.append(("telegram", check_telegram))
    if settings.slack_enabled:
        checks.append(("slack", check_slack))
    scrub = RedactSecrets(known_secrets(settings)).scrub  # error texts may quote URLs with tokens
    failed = 0

    def show(name: str, result: Result) -> None:
        nonlocal failed
        if result.ok:
            print(scrub(f"ok    {name:<8}  {result.detail}"), file=out)
        else:
            failed += 1
            print(scrub(f"FAIL  {name:<8}  {result.detail} — fix: {result.fix}"), file=out)

    for name, check in checks:
        try:
            result = await asyncio.wait_for(check(settings), 30)
        except TimeoutError:
            result = Result(False, "timed out after 30 s", "check the network")
        show(name, result)
    for name, result in await check_mcp(settings):
        show(name, result)
    bash = await check_bash(settings)
    if bash is None:
        print("note  bash      turned off (BUB_TOOLS does not list bash)", file=out)
    elif bash.ok or settings.shell_sandbox != "auto":
        show("bash", bash)
    else:  # auto and no sandbox: the bot serves without bash; said, not failed
        print(scrub(f"note  bash      {bash.detail}"), file=out)
    warning = readable_by_others(settings.home)
    if warning:
        print(scrub(f"warn  home      {warning}"), file=out)
    if not settings.telegram_enabled and not settings.slack_enabled:
        print(
            "note  channels  none configured (set BUB_TELEGRAM_TOKEN or BUB_SLACK_BOT_TOKEN)",
            file=out,
        )
    return 1 if failed else 0
