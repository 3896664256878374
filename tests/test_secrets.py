"""Secrets stay out of the model's reach: secret files are refused, configured secret values
are scrubbed from tool results and replies, and the default workspace is not the working
directory (where the quick start keeps `.env`)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from bub_bot.agent import ToolContext, default_registry
from bub_bot.config import Settings, load_settings
from bub_bot.secrets import REDACTED, Scrubber, secret_setting_names, secrets_of
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls

OPENAI_KEY = "sk-proj-SECRETopenai0123456789abcdef"
TELEGRAM_TOKEN = "123456789:AAE-SECRETtelegram-0123456789abcdef"
TELEGRAM_HALF = TELEGRAM_TOKEN.split(":", 1)[1]
SLACK_BOT = "xoxb-1-SECRETslackbot-0123456789"
SLACK_APP = "xapp-1-SECRETslackapp-0123456789"
SIGNING = "SECRETsigning0123456789abcdef0123"
WEBHOOK = "SECRETwebhook_0123456789"
METRICS = "SECRETmetrics-0123456789"
ALL_SECRETS = [OPENAI_KEY, TELEGRAM_TOKEN, TELEGRAM_HALF, SLACK_BOT, SLACK_APP, SIGNING, METRICS]
ALL_SECRETS.append(WEBHOOK)

DOTENV = f"""OPENAI_API_KEY={OPENAI_KEY}
BUB_TELEGRAM_TOKEN={TELEGRAM_TOKEN}
BUB_SLACK_BOT_TOKEN={SLACK_BOT}
BUB_SLACK_APP_TOKEN={SLACK_APP}
BUB_SLACK_SIGNING_SECRET={SIGNING}
BUB_METRICS_TOKEN={METRICS}
"""

_SCRIPT = Path(sys.executable).with_name("bub-bot")
BUB = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "bub_bot"]


def leaks(text: str) -> list[str]:
    """The secrets (or their secret half) found in `text`."""
    return [s for s in ALL_SECRETS if s in text]


def secret_settings(**overrides: Any) -> dict[str, Any]:
    return {
        "openai_api_key": OPENAI_KEY,
        "telegram_token": TELEGRAM_TOKEN,
        "telegram_webhook_secret": WEBHOOK,
        "slack_bot_token": SLACK_BOT,
        "slack_app_token": SLACK_APP,
        "slack_signing_secret": SIGNING,
        "metrics_token": METRICS,
        **overrides,
    }


def tool_contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


# -- the quick start, as a user runs it -------------------------------------------------------


@pytest.mark.parametrize("workspace_setting", ["default", "dot"])
async def test_quick_start_show_me_the_env_file_leaks_nothing(tmp_path, workspace_setting):
    """`.env` in the working directory, `bub-bot run "show me the file .env"`: neither the model,
    the reply nor the tape database sees a secret, with the default workspace and with the
    `BUB_WORKSPACE=.` that older copies of .env.example set."""
    app = tmp_path / "app"
    app.mkdir()
    home = tmp_path / "home"
    async with FakeOpenAI() as fake:
        dotenv = DOTENV + f"OPENAI_BASE_URL={fake.base_url}\nBUB_MODEL=fake-model\n"
        dotenv += f"BUB_HOME={home}\nBUB_MODEL_RETRIES=0\n"
        if workspace_setting == "dot":
            dotenv += "BUB_WORKSPACE=.\n"
        (app / ".env").write_text(dotenv, encoding="utf-8")
        (app / "notes.txt").write_text("project notes", encoding="utf-8")
        # The model does what was asked, and then (as a model that learned the key elsewhere
        # might) repeats the key in its answer.
        fake.script(
            tool_calls(
                [("fs_read", {"path": ".env"}), ("fs_list", {}), ("fs_read", {"path": "notes.txt"})]
            ),
            text(f"Here is the file. Your key is {OPENAI_KEY} and the bot token {TELEGRAM_TOKEN}."),
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BUB_", "OPENAI_"))}
        proc = await asyncio.create_subprocess_exec(
            *BUB,
            "run",
            "show me the file .env",
            env=env,
            cwd=app,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        requests = fake.completion_requests()

    assert len(requests) == 2
    read, listing, notes = tool_contents(requests[1].body["messages"])
    assert read.startswith("error: refused: '.env' may hold secrets")
    if workspace_setting == "dot":
        assert ".env" in json.loads(listing)  # the name is no secret, its content is
        assert notes == "project notes"
    else:  # the working directory is not the workspace, which starts empty
        assert json.loads(listing) == [] and notes == "error: no such file: 'notes.txt'"
        assert (home / "workspace").is_dir()
    assert leaks(json.dumps([r.body for r in requests])) == []
    reply = out.decode()
    assert reply.startswith("Here is the file.") and REDACTED in reply
    assert leaks(reply) == [] and leaks(err.decode()) == []
    stored = b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file())
    assert stored and [s for s in ALL_SECRETS if s.encode() in stored] == []


def test_default_workspace_is_under_home_not_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("BUB_WORKSPACE", "BUB_HOME"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings(require_model=False, _env_file=None, home=tmp_path / "data")
    assert settings.workspace == tmp_path / "data" / "workspace"
    settings = load_settings(require_model=False, _env_file=None, home=Path("~/.bub-x"))
    assert settings.workspace == Path("~/.bub-x/workspace").expanduser()
    explicit = load_settings(require_model=False, _env_file=None, workspace=Path("."))
    assert explicit.workspace == Path(".")


# -- a turn through the fake model ------------------------------------------------------------


async def test_turn_reading_secrets_keeps_them_off_the_tape_and_out_of_the_reply(
    fake_openai, agent, tape, workspace
):
    (workspace / ".env").write_text(DOTENV, encoding="utf-8")
    # A file the name rules do not catch: the values are scrubbed instead.
    (workspace / "notes.md").write_text(
        f"deploy notes\nkey: {OPENAI_KEY}\nslack: {SLACK_BOT}\nhook: {WEBHOOK}\n", encoding="utf-8"
    )
    (workspace / "AGENTS.md").write_text(f"Never say {METRICS}.", encoding="utf-8")
    fake_openai.script(
        tool_calls(
            [
                ("fs_read", {"path": ".env"}),
                ("fs_read", {"path": "notes.md"}),
                ("tape_search", {"query": "SECRET"}),
            ],
            content=f"Looking (psst: {SIGNING})",
        ),
        text(f"Your key is {OPENAI_KEY}; telegram {TELEGRAM_HALF}."),
    )
    user = {"role": "user", "content": "show me the file .env"}
    result = await agent(**secret_settings()).run_turn(tape, [user])

    assert result.status == "ok"
    assert result.reply == f"Your key is {REDACTED}; telegram {REDACTED}."
    refused, notes, _search = tool_contents(fake_openai.last_messages())
    assert refused.startswith("error: refused: '.env'")
    assert notes == f"deploy notes\nkey: {REDACTED}\nslack: {REDACTED}\nhook: {REDACTED}\n"
    assert leaks(json.dumps([r.body for r in fake_openai.completion_requests()])) == []
    entries = await tape.query()
    assert leaks(json.dumps([[e.payload, e.meta] for e in entries], ensure_ascii=False)) == []
    assert result.entry is not None and leaks(json.dumps(result.entry.payload)) == []


async def test_structured_and_spilled_tool_results_are_scrubbed(fake_openai, agent, tape):
    registry = default_registry()

    @registry.tool("demo.env")
    async def demo_env(ctx: ToolContext, big: bool = False) -> Any:
        """Return settings-like data."""
        rows = [{"name": "OPENAI_API_KEY", "value": OPENAI_KEY, OPENAI_KEY: [TELEGRAM_TOKEN]}]
        return {"rows": rows * (2000 if big else 1)}

    fake_openai.script(
        tool_calls([("demo_env", {}), ("demo_env", {"big": True})]),
        text("done"),
    )
    await agent(registry, **secret_settings()).run_turn(tape, [{"role": "user", "content": "x"}])
    small, big = tool_contents(fake_openai.last_messages())
    assert json.loads(small)["rows"][0] == {
        "name": "OPENAI_API_KEY",
        "value": REDACTED,
        REDACTED: [REDACTED],
    }
    assert "spill.read" in big and leaks(big) == []
    side = await tape.sidecar("spill").query()
    assert side and leaks(json.dumps([e.payload for e in side])) == []
    assert leaks(json.dumps([e.payload for e in await tape.query()])) == []


# -- the file rules ---------------------------------------------------------------------------

REFUSED = [
    ".env",
    ".ENV",
    ".env.local",
    ".env.production",
    "config/.env",
    "prod.env",
    "server.pem",
    "tls/private.key",
    "id_rsa",
    "keys/id_ed25519",
    ".git/config",
    ".git/HEAD",
    ".ssh/config",
    ".aws/credentials",
    ".netrc",
    ".npmrc",
    "secrets.yaml",
    "infra/terraform.tfstate",
    "link_to_env.txt",  # a symlink to .env: the target decides
    # found readable in a security review
    ".envrc",
    ".cargo/credentials.toml",
    ".config/gh/hosts.yml",
    ".vault-token",
    ".my.cnf",
    ".s3cfg",
    ".boto",
    ".terraformrc",
    "service-account.json",
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".psql_history",
    "deploy/my-service-account-key.json",
    ".config/gcloud/application_default_credentials.json",
    "home/.config/gh/hosts.yml",
    "krb5.keytab",
    ".histfile",
]
ALLOWED = [
    ".env.example",
    "environment.md",
    "notes.txt",
    ".gitignore",
    "keys.md",
    "monkey.txt",
    "hosts.yml",  # a common name alone; gh/hosts.yml is refused
]


@pytest.fixture
def secret_tree(workspace: Path) -> Path:
    for rel in REFUSED + ALLOWED:
        if rel == "link_to_env.txt":
            continue
        path = workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():  # .ENV and .env are one file on a case-insensitive disk
            path.write_text(f"content of {rel} {OPENAI_KEY}", encoding="utf-8")
    os.symlink(workspace / ".env", workspace / "link_to_env.txt")
    return workspace


async def test_secret_files_are_refused_and_others_read(tape, settings, secret_tree):
    registry = default_registry()
    conf = settings(**secret_settings())
    ctx = ToolContext(tape=tape, workspace=secret_tree, settings=conf)
    for rel in REFUSED:
        ok, body = await registry.call(ctx, "fs.read", json.dumps({"path": rel}))
        assert not ok and body.startswith(f"error: refused: {rel!r}"), (rel, body)
        assert "secret" in body and OPENAI_KEY not in body
    for rel in ALLOWED:
        ok, body = await registry.call(ctx, "fs.read", json.dumps({"path": rel}))
        # read, with the configured secret value scrubbed by fs.read itself
        assert ok and body == f"content of {rel} [redacted]", (rel, body)
    for directory in (".git", ".ssh", ".aws", "tls/../.aws"):
        ok, body = await registry.call(ctx, "fs.list", json.dumps({"path": directory}))
        assert not ok and ("refused" in body or "'..' is not allowed" in body), body
    ok, body = await registry.call(ctx, "fs.list", json.dumps({}))
    assert ok and ".env" in body and ".git/" in body  # names are listed, contents are not


async def test_the_bots_own_data_is_refused_when_it_lies_in_the_workspace(
    store, tape, settings, workspace
):
    registry = default_registry()
    home = workspace / "data"
    home.mkdir()
    (home / "bub.db").write_bytes(b"SQLite format 3\x00 other conversations")
    (workspace / "readme.txt").write_text("hello", encoding="utf-8")
    conf = settings(home=home)
    ctx = ToolContext(tape=tape, workspace=workspace, settings=conf)
    for rel in ("data/bub.db", "data"):
        tool = "fs.read" if rel.endswith(".db") else "fs.list"
        ok, body = await registry.call(ctx, tool, json.dumps({"path": rel}))
        assert not ok and body.startswith(f"error: refused: {rel!r}"), body
        assert "bub-bot's own data" in body
    # The workspace may itself live in BUB_HOME (the default): only the database is refused.
    db = workspace / "tapes.db"
    db.write_bytes(b"SQLite format 3\x00")
    inside = settings(home=workspace, database_url=f"sqlite:///{db}")
    ctx = ToolContext(tape=tape, workspace=workspace, settings=inside)
    ok, body = await registry.call(ctx, "fs.read", json.dumps({"path": "readme.txt"}))
    assert ok and body == "hello"
    for rel in ("tapes.db", "tapes.db-wal"):
        (workspace / rel).touch()
        ok, body = await registry.call(ctx, "fs.read", json.dumps({"path": rel}))
        assert not ok and "bub-bot's own data" in body, body


# -- the scrubber and the secret settings -----------------------------------------------------


def test_every_secret_setting_is_scrubbed_and_new_ones_are_found_by_name(tmp_path):
    names = set(secret_setting_names(Settings(_env_file=None)))
    expected = {
        "openai_api_key",
        "telegram_token",
        "telegram_webhook_secret",
        "slack_bot_token",
        "slack_app_token",
        "slack_signing_secret",
        "metrics_token",
    }
    assert expected <= names
    assert not {"max_tokens", "model", "telegram_api_base", "slack_api_url"} & names
    conf = load_settings(_env_file=None, home=tmp_path, **secret_settings())
    assert set(secrets_of(conf)) == set(ALL_SECRETS)

    class Later(Settings):
        web_token: str | None = None
        database_url: str | None = None

    later = Later(
        _env_file=None,
        web_token="SECRETweb-0123",
        database_url="postgresql://bub:SECRETpg-pass@db:5432/bub",
        openai_api_key="short",  # under 6 characters: not worth scrubbing everywhere
    )
    assert set(secrets_of(later)) == {"SECRETweb-0123", "SECRETpg-pass"}


def test_scrubber_replaces_longest_first_and_keeps_other_values():
    scrub = Scrubber(["abcdef", "abcdef-ghijkl", ""])
    assert scrub.text("x abcdef-ghijkl y abcdef z") == f"x {REDACTED} y {REDACTED} z"
    value = {"a": ["abcdef", 1, None, True], "abcdef": {"k": 2.5}}
    assert scrub.value(value) == {"a": [REDACTED, 1, None, True], REDACTED: {"k": 2.5}}
    nothing = Scrubber([])
    assert not nothing and nothing.text("abcdef") == "abcdef"


@pytest.mark.parametrize("cut", [1, 5, 12, 30])
async def test_a_secret_across_two_pages_never_comes_out_in_halves(
    tape, settings, workspace: Path, cut: int
) -> None:
    """Each fs.read page is scrubbed with the text around it: a key split by the page
    boundary is redacted on both sides (found by review: two pages gave both halves)."""
    registry = default_registry()
    conf = settings(**secret_settings())
    ctx = ToolContext(tape=tape, workspace=workspace, settings=conf)
    prefix = "notes: our key is "
    (workspace / "notes.md").write_text(f"{prefix}{OPENAI_KEY}\nend\n", encoding="utf-8")
    split = len(prefix) + cut
    ok, first = await registry.call(
        ctx, "fs.read", json.dumps({"path": "notes.md", "limit": split})
    )
    ok2, second = await registry.call(
        ctx, "fs.read", json.dumps({"path": "notes.md", "offset": split})
    )
    assert ok and ok2
    assert first.startswith(prefix + "[redacted]")
    assert f"offset={split})" in first  # the position is the file's, not the scrubbed text's
    assert second == "[redacted]\nend\n"
    for half in (OPENAI_KEY[:cut], OPENAI_KEY[cut:]):
        if len(half) >= 4:
            assert half not in first + second
