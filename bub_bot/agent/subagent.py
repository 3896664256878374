"""Subagents: a turn of its own, on a tape of its own, whose answer is a tool result.

`subagent(prompt, session="temp", tools=None, model=None, background=False)`:

- `temp`: a fresh tape for the one-off session `<parent session>/temp/<id>`; the child sees
  only the prompt (with the system prompt and skills). Archived when it ends (the viewer
  lists it under the parent), never in the parent's context.
- `inherit`: a fork of the parent's tape at this point (tape/fork.py): the child sees the
  parent's conversation since its last anchor, then the prompt. Only its answer comes back
  (the tool result): merging its work into the parent mid-step would put the child's
  messages between the parent's tool call and its result. Its fork is archived for the
  viewer.
- a name (`research`: lower-case letters, digits, `-`, `_`): the tape of the session
  `<parent session>/agents/<name>`, kept across calls, so a second call continues the first's
  context. Each run works on a fork of it, merged when the run answers and archived when it
  fails or times out: a failed run leaves no half-done work in the named context.

Limits (operator settings): nesting depth (`BUB_SUBAGENT_MAX_DEPTH`; the tool is not offered
at the maximum), subagents at once per conversation (`BUB_SUBAGENT_MAX_CONCURRENT`,
background ones included), steps (`BUB_SUBAGENT_MAX_STEPS`) and a deadline
(`BUB_SUBAGENT_TIMEOUT_SECONDS`). `tools` narrows the parent's tools, never widens them;
`model` is BUB_MODEL or one of `BUB_SUBAGENT_MODELS`. The child's model use is charged to the
parent turn's origin: its `loop.start` and `run` events carry `payer` (session, channel,
sender), and its usage is added to the parent turn's.

`background=true` hands the call to the runtime (`Background`, bub_bot/runtime/subagents.py),
which runs it durably and brings its result into the conversation as a message of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from pydantic import Field

from ..tape import Tape, TapeEntry, TapeStore, fork
from ..tape.names import fork_name
from .tools import Origin, ToolContext, ToolError, ToolRegistry, payer_of

if TYPE_CHECKING:
    from .loop import Agent

log = logging.getLogger(__name__)

TEMP = "temp"
INHERIT = "inherit"
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
TOOL = "subagent"


@dataclass(frozen=True, slots=True)
class SubagentCall:
    """One subagent run as decided when it was asked for (stored as a background job's
    data, so a restart runs the same thing)."""

    id: str
    prompt: str
    session: str
    """temp, inherit, or a name."""
    allowed: list[str]
    """The tool names it may use."""
    model: str | None
    depth: int
    """The child's depth (its parent's + 1)."""
    parent_tape: str
    parent_session: str
    workspace: str
    payer: dict[str, Any] = field(default_factory=dict)
    """Whom its model use is charged to: the parent turn's origin."""
    origin: dict[str, Any] = field(default_factory=dict)
    """The parent turn's origin (where a background result goes)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SubagentCall:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    @property
    def tape_session(self) -> str:
        """The session id of the child's own tape (temp and named)."""
        if self.session == TEMP:
            return f"{self.parent_session}/temp/{self.id}"
        return f"{self.parent_session}/agents/{self.session}"


@dataclass(frozen=True, slots=True)
class SubagentOutcome:
    """How a run ended: `status` ok | error | timeout | max_steps | overflow."""

    status: str
    text: str
    usage: dict[str, int]
    tape: str
    """Where its work is now: an archive (temp, inherit, a failed named run) or the named
    tape (merged)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Background(Protocol):
    """What runs background subagents (the runtime's)."""

    async def start(self, call: SubagentCall, running_here: int) -> str:
        """Store and start `call`; returns what the tool answers. Raises ToolError when
        the conversation runs as many as it may (`running_here`: tool calls running now in
        this process; the background ones are counted from the store)."""
        ...

    async def running(self, session_id: str) -> int:
        """Background subagents of a conversation not finished yet."""
        ...


class Subagents:
    """Runs subagent calls for one agent, counting the ones running per conversation."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.settings = agent.settings
        self.background: Background | None = None
        self.active: Counter[str] = Counter()
        """Subagents running in this process as tool calls (not background ones: those are
        jobs, counted in the store), by conversation (the parent turn's origin)."""

    # -- deciding ------------------------------------------------------------------------------
    def call(
        self,
        ctx: ToolContext,
        prompt: str,
        session: str,
        tools: list[str] | None,
        model: str | None,
    ) -> SubagentCall:
        """Check the arguments against the operator's limits; ToolError names what is wrong."""
        limit = self.settings.subagent_max_depth
        if ctx.depth >= limit:
            raise ToolError(f"subagents may nest {limit} deep (BUB_SUBAGENT_MAX_DEPTH)")
        if not prompt.strip():
            raise ToolError("prompt: give the subagent something to do")
        if session not in (TEMP, INHERIT) and not NAME.fullmatch(session):
            raise ToolError(
                f"session: {session!r} is not 'temp', 'inherit' or a name of lower-case"
                " letters, digits, '-' and '_' (at most 32)"
            )
        registry = self.agent.tools
        offered = {t.name for t in registry.visible(ctx.workspace)}
        if ctx.allowed_tools is not None:
            offered &= ctx.allowed_tools
        allowed = set(offered)
        if tools is not None:
            allowed = set()
            for name in tools:
                tool = registry.get(name, ctx.workspace)
                if tool is None or tool.name not in offered:
                    raise ToolError(
                        f"tools: {name!r} is not a tool this conversation may use; a subagent"
                        " gets some of yours, never others"
                    )
                allowed.add(tool.name)
        depth = ctx.depth + 1
        if depth >= limit:
            allowed.discard(TOOL)
        bot_model = self.settings.model
        if model is not None and model != bot_model and model not in self.settings.subagent_models:
            raise ToolError(
                f"model: {model!r} is not allowed (BUB_SUBAGENT_MODELS lists the models a"
                f" subagent may use besides {bot_model})"
            )
        origin = ctx.origin
        return SubagentCall(
            id=f"sa-{uuid.uuid4().hex[:10]}",
            prompt=prompt,
            session=session,
            allowed=sorted(allowed),
            model=model if model not in (None, bot_model) else ctx.model,
            depth=depth,
            parent_tape=ctx.tape.name,
            parent_session=ctx.tape.session_id or origin.session_id,
            workspace=str(ctx.workspace),
            payer=payer_of(origin),
            origin={
                "session_id": origin.session_id,
                "channel": origin.channel,
                "reply_target": origin.reply_target,
                "sender": origin.sender,
            },
        )

    # -- running -------------------------------------------------------------------------------
    async def run(
        self,
        store: TapeStore,
        call: SubagentCall,
        *,
        restarted: bool = False,
        seconds: float | None = None,
    ) -> SubagentOutcome:
        """Run `call` to its end (its deadline: `seconds`, default BUB_SUBAGENT_TIMEOUT_SECONDS);
        never raises for the child's failure. `restarted`: an interrupted run of it is set
        aside (archived) first. Background runs come here; a tool call counts itself
        (`hold`) around `_run`."""
        return await self._run(store, call, restarted, seconds)

    @contextlib.contextmanager
    def hold(self, conversation: str) -> Iterator[int]:
        """Count one more subagent running here for `conversation` (taken at once, before
        any await, so calls of one step count each other); yields how many ran before."""
        before = self.active[conversation]
        self.active[conversation] += 1
        try:
            yield before
        finally:
            self.active[conversation] -= 1
            if self.active[conversation] <= 0:
                del self.active[conversation]

    async def _run(
        self, store: TapeStore, call: SubagentCall, restarted: bool, seconds: float | None = None
    ) -> SubagentOutcome:
        workspace = Path(call.workspace)
        if call.session == TEMP:
            tape = Tape.for_session(store, call.tape_session, workspace)
            if restarted:
                await store.discard(tape.name, archive=True, whole=True)
        else:
            home = Tape(store, call.parent_tape, call.parent_session)
            if call.session != INHERIT:
                home = Tape.for_session(store, call.tape_session, workspace)
                await home.ensure_bootstrap_anchor()
            if restarted:
                # Half a run is no answer: the interrupted fork is kept, archived, and the
                # run starts again from the prompt.
                await store.discard(fork_name(home.name, call.id), archive=True)
            tape = await fork(home, tag=call.id)
        prompt = TapeEntry.message(
            {"role": "user", "content": call.prompt},
            subagent=call.id,
            parent=call.parent_tape,
            payer=call.payer,
        )
        written = await tape.append_many([prompt], bootstrap=True)
        origin = call.origin
        limit = self.settings.subagent_timeout_seconds
        seconds = limit if seconds is None else min(seconds, limit)
        log.info(
            "subagent.start session=%s id=%s mode=%s depth=%d",
            call.parent_session,
            call.id,
            call.session,
            call.depth,
        )
        try:
            async with asyncio.timeout(seconds):
                result = await self.agent.run_turn(
                    tape,
                    workspace=workspace,
                    turn_id=call.id,
                    turn_start=written[-1].id - 1,
                    origin=Origin(
                        session_id=str(origin.get("session_id") or call.parent_session),
                        channel=str(origin.get("channel") or ""),
                        reply_target=dict(origin.get("reply_target") or {}),
                        sender=dict(origin.get("sender") or {}),
                        via="subagent",
                    ),
                    depth=call.depth,
                    allowed_tools=frozenset(call.allowed),
                    model=call.model,
                    max_steps=self.settings.subagent_max_steps,
                    payer=call.payer,
                )
            status, text, usage = result.status, result.reply, result.usage
        except TimeoutError:
            status, text, usage = "timeout", f"it did not finish within {seconds:g} s", {}
        except asyncio.CancelledError:
            # Stopped (or the bot is shutting down): its tape is set aside, not merged.
            with contextlib.suppress(Exception):
                await self._finish(store, call, tape, False)
            raise
        except Exception as exc:
            log.exception("subagent.failed session=%s id=%s", call.parent_session, call.id)
            status, text, usage = "error", f"{type(exc).__name__}: {exc}", {}
        where = await self._finish(store, call, tape, status == "ok")
        mode = call.session if call.session in (TEMP, INHERIT) else "named"
        self.agent.notify("subagent", {"mode": mode, "status": status})
        log.info(
            "subagent.end session=%s id=%s status=%s tape=%s",
            call.parent_session,
            call.id,
            status,
            where,
        )
        return SubagentOutcome(status, text, usage, where)

    async def _finish(self, store: TapeStore, call: SubagentCall, tape: Tape, ok: bool) -> str:
        """Put the child's tape where it belongs now; returns where that is."""
        if call.session == TEMP:
            archived = await store.discard(tape.name, archive=True, whole=True)
            return archived or tape.name
        if call.session != INHERIT and ok:
            merged = await store.merge(tape.name)
            return merged.parent
        archived = await store.discard(tape.name, archive=True)
        return archived or tape.name


def register_subagent_tool(registry: ToolRegistry, subagents: Subagents) -> None:
    """Add the `subagent` tool to `registry` (not offered when BUB_SUBAGENT_MAX_DEPTH is 0)."""

    @registry.tool(TOOL, model_visible=subagents.settings.subagent_max_depth > 0)
    async def subagent(
        ctx: ToolContext,
        prompt: Annotated[str, Field(description="The task, with everything the helper needs")],
        session: Annotated[
            str,
            Field(
                description="'temp' (fresh, sees only the prompt), 'inherit' (sees this"
                " conversation so far), or a name (its own memory, continued across calls)"
            ),
        ] = TEMP,
        tools: Annotated[
            list[str] | None, Field(description="Only these of your tools (default: all)")
        ] = None,
        model: Annotated[str | None, Field(description="Another allowed model")] = None,
        background: Annotated[
            bool,
            Field(description="Return at once; the result arrives here later as a message"),
        ] = False,
    ) -> str:
        """Hand a task to a helper agent and get its final answer. Use it for work that can
        be done apart (research, a long analysis, several independent questions at once:
        calls in one step run concurrently). With background=true you answer now and the
        helper's result comes into this conversation when it is done."""
        call = subagents.call(ctx, prompt, session, tools, model)
        conversation = ctx.origin.session_id or call.parent_session
        here = subagents.active[conversation]
        limit = subagents.settings.subagent_max_concurrent
        if background:
            if ctx.depth > 0 or subagents.background is None:
                raise ToolError("background subagents start only from a conversation's own turn")
            return await subagents.background.start(call, here)
        with subagents.hold(conversation) as before:
            running = before + (
                await subagents.background.running(conversation) if subagents.background else 0
            )
            if running >= limit:
                raise ToolError(
                    f"{running} subagents are running in this conversation, the most allowed"
                    f" (BUB_SUBAGENT_MAX_CONCURRENT={limit}); wait for one to finish"
                )
            outcome = await subagents._run(ctx.tape.store, call, False)
        for key, value in outcome.usage.items():
            if isinstance(value, int):
                ctx.usage[key] = ctx.usage.get(key, 0) + value
        ctx.records.append(
            TapeEntry.event(
                "subagent.end",
                {
                    "id": call.id,
                    "session": call.session,
                    "status": outcome.status,
                    "tape": outcome.tape,
                    "usage": outcome.usage,
                },
                context=False,
            )
        )
        if not outcome.ok:
            raise ToolError(f"subagent {call.id} failed ({outcome.status}): {outcome.text}")
        return outcome.text
