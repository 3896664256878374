"""Shared fixtures: the fake model server, a real SQLite store, settings and agents."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bub_bot.agent import Agent, ModelClient, ToolRegistry, default_registry
from bub_bot.config import Settings, load_settings
from bub_bot.tape import SQLiteTapeStore, Tape
from tests.fakes.openai_server import FakeOpenAI

SESSION = "test:session"


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteTapeStore]:
    opened = await SQLiteTapeStore.open(tmp_path / "home" / "bub.db")
    yield opened
    await opened.close()


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
