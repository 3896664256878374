"""The tool registry: typed async functions exposed to the model with JSON-schema parameters."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, get_type_hints

import pydantic

from ..secrets import Scrubber
from ..toolgroups import group_of, offered

if TYPE_CHECKING:
    from ..config import Settings
    from ..tape import Tape, TapeEntry


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a turn's work came from: the newest message it answers. Its answer goes to
    `channel` / `reply_target`; `sender` is whom it counts for; `via` is the message's
    `meta.origin` ("" for a chat message, "schedule" for a due job's)."""

    session_id: str = ""
    channel: str = ""
    reply_target: dict[str, Any] = field(default_factory=dict)
    sender: dict[str, Any] = field(default_factory=dict)
    via: str = ""
    payer: dict[str, Any] = field(default_factory=dict)
    """The message's `meta.payer` when work runs for someone other than its sender (a
    subagent, an approval's continuation): budgets charge them (bub_bot/budgets/payer.py)."""


def payer_of(origin: Origin) -> dict[str, Any]:
    """Whom a turn's model use is charged to: its origin's conversation and person (and its
    `payer` when the work runs for someone else: it wins, `metering.charge_of`)."""
    found = {"session_id": origin.session_id, "channel": origin.channel, "sender": origin.sender}
    if origin.payer:
        found["payer"] = dict(origin.payer)
    return found


@dataclass
class ToolContext:
    """What a tool may touch: the session's tape, its workspace, and deferred tape writes."""

    tape: Tape
    workspace: Path
    settings: Settings
    deferred: list[TapeEntry] = field(default_factory=list)
    """Entries written right after the current step (a handoff must follow the step's
    tool call and result, not precede them)."""
    handed_off: bool = False
    origin: Origin = field(default_factory=Origin)
    """The conversation and person the turn is for (tools that post later: schedules)."""
    groups: frozenset[str] | None = None
    """The tool groups offered here (BUB_TOOLS narrowed by the workspace rule); None: all."""
    network: bool = False
    """The workspace rule lets sandboxed commands use the network (an operator's choice)."""
    # subagents (bub_bot/agent/subagent.py)
    depth: int = 0
    """0 for a conversation's own turn; a subagent's is its parent's + 1."""
    allowed_tools: frozenset[str] | None = None
    """The tool names this turn may call (None: every tool offered); a subagent's `tools`
    argument narrows its parent's, never widens it."""
    model: str | None = None
    """The model this turn uses (None: BUB_MODEL)."""
    usage: dict[str, int] = field(default_factory=dict)
    """Token usage of work the step's tools ran (a subagent's), added to the turn's."""
    records: list[TapeEntry] = field(default_factory=list)
    """Entries written with the current step, after its tool results (audit events)."""
    scrubber: Scrubber | None = None
    """The agent's secret scrubber (built once, not per call); None: build from settings."""

    def scrub(self) -> Scrubber:
        """The scrubber for what a tool reads (the agent's when it gave one)."""
        if self.scrubber is None:
            self.scrubber = Scrubber.for_settings(self.settings)
        return self.scrubber


class ToolError(Exception):
    """A tool's clear refusal; its message goes to the model as the result."""


@dataclass
class Tool:
    """A callable the model may use."""

    name: str
    description: str
    params: type[pydantic.BaseModel]
    handler: Callable[..., Awaitable[Any]]
    model_visible: bool = True
    spillable: bool = True
    group: str = ""
    """tape, fs, spill, bash, web, skills, mcp or schedule (default: from the name)."""
    read_only: bool | None = None
    """MCP `readOnlyHint` (None: not annotated); the approval policy allows read-only tools."""
    destructive: bool | None = None
    """MCP `destructiveHint` (None: not annotated)."""
    _schema: tuple[tuple[Any, ...], dict[str, Any]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not self.group:
            self.group = group_of(self.name)

    @property
    def exposed_name(self) -> str:
        """The name the model sees: dots are not allowed in function names."""
        return self.name.replace(".", "_")

    def arguments(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The handler's keyword arguments from the model's JSON (raises ValidationError)."""
        return self.params.model_validate(raw).model_dump()

    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools` entry (built once: pydantic's schema generation costs ~0.4 ms
        a tool, which every model step would pay otherwise). Callers must not mutate it."""
        key = (self.name, self.description, self.params)
        if self._schema is None or self._schema[0] != key:
            self._schema = (key, self._build_schema())
        return self._schema[1]

    def _build_schema(self) -> dict[str, Any]:
        params = self.params.model_json_schema()
        params.pop("title", None)
        for prop in params.get("properties", {}).values():
            prop.pop("title", None)
        params.setdefault("properties", {})
        return {
            "type": "function",
            "function": {
                "name": self.exposed_name,
                "description": self.description,
                "parameters": params,
            },
        }


def _params_model(fn: Callable[..., Any], name: str) -> type[pydantic.BaseModel]:
    """A pydantic model of `fn`'s parameters after the leading context argument."""
    hints = get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    for index, param in enumerate(inspect.signature(fn).parameters.values()):
        if index == 0:
            continue  # the ToolContext
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model_name = "".join(part.title() for part in name.replace("_", ".").split(".")) + "Params"
    return pydantic.create_model(
        model_name, __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )


class ToolSource(Protocol):
    """Tools that come and go (MCP servers): asked for the current ones at every step."""

    def tools(self, workspace: Path | None = None, reserved: set[str] | None = None) -> list[Tool]:
        """The tools to offer now; none named like `reserved` (the registry's own)."""
        ...

    def resolve(self, name: str, workspace: Path | None = None) -> Tool | None:
        """A tool by dotted or exposed name, also one not offered right now."""
        ...

    async def prepare(self, workspace: Path | None = None) -> None:
        """Get ready before a turn (bounded wait for tools still being discovered)."""
        ...


class ToolRegistry:
    """Tools by name; resolves the model's underscore names back to dotted ones."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self.sources: list[ToolSource] = []
        self.missing: dict[str, str] = {}
        """Tools not offered on this server at all, and why (bash without a sandbox)."""

    def add(self, tool: Tool) -> Tool:
        self._tools[tool.name] = tool
        return tool

    def tool(
        self, name: str, *, model_visible: bool = True, spillable: bool = True, group: str = ""
    ) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
        """Register `async def fn(ctx, **typed_params)`; its docstring is the description.
        `group`: its tool group when the name does not say it (default: from the name)."""

        def register(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            description = inspect.cleandoc(fn.__doc__ or name)
            params = _params_model(fn, name)
            self.add(Tool(name, description, params, fn, model_visible, spillable, group))
            return fn

        return register

    def get(self, name: str, workspace: Path | None = None) -> Tool | None:
        """Look up by dotted or exposed name (the registry's own tools, then the sources')."""
        if name in self._tools:
            return self._tools[name]
        for tool in self._tools.values():
            if tool.exposed_name == name:
                return tool
        for source in self.sources:
            found = source.resolve(name, workspace)
            if found is not None:
                return found
        return None

    def own(self, groups: frozenset[str] | None = None) -> list[Tool]:
        """The registry's own (built-in) tools the model sees (in `groups`; None: all)."""
        return [t for t in self._tools.values() if t.model_visible and offered(t.group, groups)]

    def visible(
        self, workspace: Path | None = None, groups: frozenset[str] | None = None
    ) -> list[Tool]:
        """The tools offered to the model: the registry's own, then the sources' current
        ones (for `workspace`; None: the default one), only those of `groups`."""
        tools = self.own(groups)
        if self.sources:
            reserved = {t.exposed_name for t in self.own()}
            for source in self.sources:
                found = source.tools(workspace, reserved)
                tools.extend(t for t in found if offered(t.group, groups))
        return tools

    def schemas(
        self, workspace: Path | None = None, groups: frozenset[str] | None = None
    ) -> list[dict[str, Any]]:
        return [t.schema() for t in self.visible(workspace, groups)]

    async def prepare(self, workspace: Path | None = None) -> None:
        """Before a turn: let the sources finish discovering their tools (bounded)."""
        for source in self.sources:
            await source.prepare(workspace)

    async def call(self, ctx: ToolContext, name: str, arguments: str) -> tuple[bool, Any]:
        """Run one call; returns (ok, result). Failures become an error result, never raise."""
        tool = self.get(name, ctx.workspace)
        if tool is not None and ctx.allowed_tools is not None:
            tool = tool if tool.name in ctx.allowed_tools else None
        if tool is None or not tool.model_visible or not offered(tool.group, ctx.groups):
            shown = self.visible(ctx.workspace, ctx.groups)
            if ctx.allowed_tools is not None:
                shown = [t for t in shown if t.name in ctx.allowed_tools]
            known = ", ".join(t.exposed_name for t in shown)
            return False, f"error: unknown tool {name!r}. Available tools: {known}"
        try:
            raw = json.loads(arguments or "{}")
            if not isinstance(raw, dict):
                raise ValueError("arguments must be a JSON object")
            kwargs = tool.arguments(raw)
        except (ValueError, pydantic.ValidationError) as exc:
            detail = _validation_text(exc)
            return False, f"error: invalid arguments for {tool.exposed_name}: {detail}"
        try:
            return True, await tool.handler(ctx, **kwargs)
        except ToolError as exc:
            return False, f"error: {exc}"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a tool bug must not end the turn
            return False, f"error: {tool.exposed_name} failed: {type(exc).__name__}: {exc}"


def _validation_text(exc: Exception) -> str:
    if isinstance(exc, pydantic.ValidationError):
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "arguments"
            parts.append(f"{where}: {err['msg']}")
        return "; ".join(parts)
    return str(exc)
