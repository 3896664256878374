"""Shared fixtures: the fake model server, real SQLite and PostgreSQL stores, settings and
agents."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bub_bot.agent import Agent, ModelClient, ToolRegistry, default_registry
from bub_bot.config import Settings, load_settings
from bub_bot.tape import SQLiteTapeStore, Tape, TapeStore, open_store
from tests.fakes.openai_server import FakeOpenAI
from tests.pg import PostgresCluster
from tests.tcp_proxy import TcpProxy

SESSION = "test:session"

# A database URL in the developer's environment (another project's DATABASE_URL) must never
# receive test data: tests name their databases explicitly.
for _name in ("BUB_DATABASE_URL", "DATABASE_URL", "BUB_DATABASE_POOL_SIZE"):
    os.environ.pop(_name, None)


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteTapeStore]:
    opened = await SQLiteTapeStore.open(tmp_path / "home" / "bub.db")
    yield opened
    await opened.close()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL server for the whole run (never skipped: without PostgreSQL
    installed this fails, naming how to install it)."""
    cluster = PostgresCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_cluster: PostgresCluster) -> str:
    """The URL of a fresh, empty PostgreSQL database for this test (its own schema in a shared
    test database: as isolated, 30 times faster to make)."""
    return pg_cluster.fresh_url()


@pytest.fixture
def pg_proxy(pg_cluster: PostgresCluster) -> Iterator[TcpProxy]:
    """A TCP proxy to the test PostgreSQL server that the test can cut and restore (route a
    database URL through it with `pg_proxy.route(url)`)."""
    with TcpProxy("127.0.0.1", pg_cluster.port) as made:
        yield made


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL for each store kind: a new SQLite file, a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tapes.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
async def any_store(store_url: str) -> AsyncIterator[TapeStore]:
    """An open store of each kind (tests using it run once per store)."""
    async with open_store(store_url) as opened:
        yield opened


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture
def settings(fake_openai: FakeOpenAI, tmp_path: Path, workspace: Path) -> Callable[..., Settings]:
    """`settings(**overrides)`: settings pointing at the fake (no retries unless asked)."""

    def make(model_retries: int = 0, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "openai_base_url": fake_openai.base_url,
            "openai_api_key": "sk-test",
            "model": "fake-model",
            "workspace": workspace,
            "home": tmp_path / "home",
            "model_retries": model_retries,
            "_env_file": None,  # a developer's .env must not change the tests
        }
        values.update(overrides)
        return load_settings(**values)

    return make


@pytest.fixture
async def agent(settings: Callable[..., Settings]) -> AsyncIterator[Callable[..., Agent]]:
    """`agent(registry=None, **settings_overrides)`: an Agent with its own model client."""
    made: list[Agent] = []

    def make(registry: ToolRegistry | None = None, **overrides: Any) -> Agent:
        conf = settings(**overrides)
        built = Agent(conf, ModelClient(conf), registry or default_registry())
        made.append(built)
        return built

    yield make
    for built in made:
        await built.model.close()


@pytest.fixture
def tape(store: SQLiteTapeStore, workspace: Path) -> Tape:
    """The test session's tape in the test workspace."""
    return Tape.for_session(store, SESSION, workspace)
