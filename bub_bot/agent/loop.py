"""The turn loop: context from the tape -> model -> tools -> tape, until the model answers."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ..budgets import Budgets
from ..config import Settings
from ..secrets import Scrubber
from ..tape import Counting, Tape, TapeEntry, default_selector, visible
from ..tape.context import Selector, load_selector
from ..toolgroups import offered
from . import metering, overflow
from .approval_gate import ASK, ApprovalGate
from .approval_settle import settle
from .model import ContextOverflow, ModelClient, ModelError
from .policy import Policies
from .prompt import build_system_prompt
from .streaming import Progress, ProgressCallback, tell
from .tool_step import run_tools
from .tools import Origin, Tool, ToolContext, ToolRegistry, payer_of

log = logging.getLogger(__name__)

EntryFilter = Callable[[list[TapeEntry]], list[TapeEntry]]
FinalAppend = Callable[[list[TapeEntry], Counting | None], Awaitable[list[TapeEntry]]]
"""Writes the entries that end a turn (the answer or notice with its records) in one
transaction and returns them with their ids; the caller may add its own entries to it."""


@dataclass
class TurnResult:
    """How a turn ended and what to tell the user.

    `status`: ok | error | max_steps | overflow | approval (the step's calls wait for a
    person: the reply entry is the `approval.request`). `reply_entry` is the tape entry whose text
    is the reply (the final assistant message, or a `turn.notice` event), so delivery can be
    resumed after a crash. `seen_through` is the newest entry id the model saw.
    """

    status: str
    reply: str
    reply_entry: int | None
    seen_through: int
    steps: int = 0
    auto_handoff: bool = False
    usage: dict[str, int] = field(default_factory=dict)
    entry: TapeEntry | None = None
    """The reply entry itself (saves the runtime a read)."""


class Agent:
    """Runs turns for any tape with one model client and one tool registry."""

    def __init__(self, settings: Settings, model: ModelClient, tools: ToolRegistry) -> None:
        self.settings = settings
        self.model = model
        self.tools = tools
        self.hooks: list[Callable[[str, dict[str, Any]], None]] = []
        """Observers of loop events (metrics): called with (event name, data)."""
        self.policies = Policies(settings)
        """Which tool groups and network each session gets (BUB_TOOLS, BUB_WORKSPACE_MAP)."""
        self.shell: Any = None
        """The bash tools' job table (`bub_bot.agent.bash.Shell`) when bash is offered."""
        self.budgets: Budgets | None = None
        """Checked before each model call; each call's usage is written with its `run` event
        (the runtime sets it; None: nothing counted)."""
        self.selector: Selector = (
            load_selector(settings.context_selector)
            if settings.context_selector
            else default_selector
        )
        """Entries -> messages for every model call (BUB_CONTEXT_SELECTOR, else the default)."""
        self.scrub = Scrubber.for_settings(settings)
        """Replaces configured secrets in tool results and the prompt (the model's replies
        are scrubbed by the model client)."""
        self.gate = ApprovalGate(settings)
        """Which calls run, wait for a person's approval, or are refused (BUB_APPROVE)."""

    def notify(self, name: str, data: dict[str, Any]) -> None:
        """Tell the observers (metrics) of an event of work the agent ran (subagents)."""
        self._notify(name, data)

    def _notify(self, name: str, data: dict[str, Any]) -> None:
        for hook in self.hooks:
            try:
                hook(name, data)
            except Exception:  # observers never break a turn
                log.exception("agent hook failed on %s", name)

    async def run_turn(
        self,
        tape: Tape,
        new_messages: Sequence[dict[str, Any]] = (),
        *,
        workspace: Path | None = None,
        selector: Selector | None = None,
        entry_filter: EntryFilter | None = None,
        before_step: Callable[[int], Awaitable[None]] | None = None,
        turn_id: str = "",
        turn_start: int | None = None,
        progress: ProgressCallback | None = None,
        origin: Origin | None = None,
        depth: int = 0,
        allowed_tools: frozenset[str] | None = None,
        model: str | None = None,
        max_steps: int | None = None,
        payer: dict[str, Any] | None = None,
        context: list[TapeEntry] | None = None,
        append_final: FinalAppend | None = None,
    ) -> TurnResult:
        """Run one turn on `tape`.

        `new_messages` are appended first (the runtime appends inbound messages itself and
        passes none). Every step reads its context fresh from the tape, so messages that
        arrive during the turn reach the model at the next step. `entry_filter` narrows the
        entries before the selector (the runtime holds back messages queued behind a
        command); `before_step(step)` runs before each model call. `turn_start`: the entry id
        after which this turn's user messages begin (default: the end of the tape).
        `progress` sees each step as it is written (its text so far; the names of the tools
        a step calls): the model streams when it is given. `origin`: where the turn's work
        came from, for the tools (`ToolContext.origin`).

        A subagent's turn (bub_bot/agent/subagent.py) passes its `depth`, the tool names it
        may use (`allowed_tools`), its `model` and `max_steps`, and `payer`: the origin of
        the parent turn, recorded in its `loop.start` and `run` events (whom its model use
        is charged to).

        Fewer trips to the store: without `new_messages` (and without `progress`: a streamed
        turn writes its start at once) the `loop.start` record waits for the first step's
        write (or whatever the turn writes first); `context` is the tape after its last
        anchor as the caller just read it (used for the first step instead of reading it
        again); `append_final(entries, usage)` writes the turn's last entries (the answer or
        notice) in place of a plain append, so the caller can add its own
        records to that transaction.
        """
        workspace = workspace or self.settings.workspace
        selector = selector or self.selector
        started_turn = time.perf_counter()
        first = [TapeEntry.message(m) for m in new_messages]
        start: dict[str, Any] = {"turn": turn_id}
        if payer is not None:
            start["payer"] = payer
        if progress is not None:
            # The runtime's mark that partial text may show (runtime/streaming.py).
            start["streams"] = True
        first.append(TapeEntry.event("loop.start", start, context=False))
        # Not written yet (no messages to put on the tape before the first model call): it
        # goes first in the turn's first write, with the bootstrap anchor if the tape has none.
        opening: list[TapeEntry] = []
        if new_messages or progress is not None:
            # A streamed turn's start is the mark that partial text may show: it must be on
            # the tape before the first partial (runtime/streaming.py, `await_partial`).
            # The bootstrap anchor (if the tape has none) goes first, in the same transaction.
            written = await tape.append_many(first, bootstrap=True)
            if turn_start is None:
                turn_start = written[0].id - 1
        else:
            opening = first
            if turn_start is None:
                turn_start = await _last_id(tape)

        async def write(entries: list[TapeEntry], usage: Counting | None = None) -> list[TapeEntry]:
            """Append a step's entries after whatever of the turn's start is not written."""
            nonlocal opening
            head, opening = opening, []
            written = await tape.append_many([*head, *entries], bootstrap=bool(head), usage=usage)
            return written[len(head) :]

        async def write_final(entries: list[TapeEntry], usage: Counting | None) -> list[TapeEntry]:
            nonlocal opening
            if append_final is None:
                return await write(entries, usage)
            head, opening = opening, []
            return (await append_final([*head, *entries], usage))[len(head) :]

        async def flush() -> None:
            """Write the turn's start before records written by others (tools, handoffs)."""
            if opening:
                await write([])

        origin = origin or Origin(session_id=tape.session_id or "")
        policy = self.policies.for_session(origin.session_id or tape.session_id or "")
        ctx = ToolContext(
            tape=tape,
            workspace=workspace,
            settings=self.settings,
            origin=origin,
            groups=policy.groups,
            network=policy.network,
            depth=depth,
            allowed_tools=allowed_tools,
            model=model,
            scrubber=self.scrub,
        )
        max_steps = max_steps or self.settings.max_steps
        await self.tools.prepare(workspace)  # MCP servers still starting: bounded wait
        usage_total: dict[str, int] = {}
        charge_to = metering.charge_of(origin, tape.session_id or "", payer)
        seen_through = 0
        auto_handed_off = False
        step = 0
        while step < max_steps:
            step += 1
            if before_step is not None:
                await before_step(step)
            step_started = time.perf_counter()
            if context is not None:
                raw, context = context, None  # read by the caller just now
            else:
                raw = await tape.query(after_last_anchor=True)
            if raw:
                seen_through = max(seen_through, raw[-1].id)
            entries = visible(raw)
            if entry_filter is not None:
                entries = entry_filter(entries)
            tools = self.tools.visible(workspace, policy.groups)
            if allowed_tools is not None:
                tools = [t for t in tools if t.name in allowed_tools]
            messages = [
                {
                    "role": "system",
                    "content": self.scrub.text(
                        build_system_prompt(
                            self.settings.system_prompt, workspace, tools, self.settings.skills_dir
                        )
                    ),
                },
                *selector(entries),
            ]
            # Before every call: a call in flight when the budget ran out finishes its step.
            where = (tape.session_id or "", turn_id, step)
            spent = await metering.spent(self.budgets, charge_to, self._notify, where)
            if spent is not None:
                return await self._end(
                    write_final,
                    "budget",
                    spent.text(),
                    step - 1,
                    seen_through,
                    usage_total,
                    auto_handoff=auto_handed_off,
                )
            try:
                schemas = [t.schema() for t in tools]
                if model is None:
                    reply = await self.model.complete(messages, schemas, on_progress=progress)
                else:
                    reply = await self.model.complete(
                        messages, schemas, on_progress=progress, model=model
                    )
            except ContextOverflow as exc:
                elapsed = _ms(step_started)
                await flush()
                if auto_handed_off:
                    await overflow.past_too_long(tape, exc, seen_through)
                    return await self._end(
                        write_final,
                        "overflow",
                        exc.user_message,
                        step,
                        seen_through,
                        usage_total,
                        error=("context_overflow", str(exc)),
                        auto_handoff=True,
                    )
                auto_handed_off = True
                self._notify("auto_handoff", {"error": str(exc)})
                log.warning("auto_handoff session=%s turn=%s: %s", tape.session_id, turn_id, exc)
                await overflow.auto_handoff(tape, exc, step, elapsed, turn_start)
                step -= 1  # the retry does not use up a step
                continue
            except ModelError as exc:
                self._notify("model_call", {"ok": False})
                await write(
                    [
                        TapeEntry.event(
                            "loop.step",
                            {"step": step, "status": "error", "elapsed_ms": _ms(step_started)},
                            context=False,
                        )
                    ]
                )
                return await self._end(
                    write_final,
                    "error",
                    exc.user_message,
                    step,
                    seen_through,
                    usage_total,
                    error=("model", str(exc)),
                    auto_handoff=auto_handed_off,
                )

            for key, value in reply.usage.items():
                if isinstance(value, int):
                    usage_total[key] = usage_total.get(key, 0) + value
            counting = None
            if self.budgets is not None:
                counting = metering.step_counting(
                    self.budgets, charge_to, reply, messages, origin.channel, self._notify
                )
            self._notify(
                "model_call",
                {
                    "latency_ms": reply.latency_ms,
                    "usage": reply.usage,
                    # Whom the call is for: a subagent's is charged to its parent turn's origin.
                    "payer": payer or payer_of(origin),
                    "subagent": payer is not None,
                },
            )
            run_data: dict[str, Any] = {
                "model": reply.model,
                "usage": reply.usage,
                "latency_ms": round(reply.latency_ms, 1),
                "step": step,
                "turn": turn_id,
            }
            if payer is not None:
                run_data["payer"] = payer
            run_event = TapeEntry.event("run", run_data, context=False)
            if not reply.tool_calls:
                final = TapeEntry.message(
                    {"role": "assistant", "content": reply.content},
                    turn=turn_id,
                    seen_through=seen_through,
                )
                written = await write_final(
                    [
                        final,
                        run_event,
                        TapeEntry.event(
                            "loop.step",
                            {"step": step, "status": "ok", "elapsed_ms": _ms(step_started)},
                            context=False,
                        ),
                    ],
                    counting,
                )
                self._notify("turn", {"status": "ok", "elapsed_ms": _ms(started_turn)})
                return TurnResult(
                    "ok",
                    reply.content,
                    written[0].id,
                    seen_through,
                    step,
                    auto_handed_off,
                    usage_total,
                    written[0],
                )

            # Only tools this session is offered are asked about (others fail as unknown).
            resolve = partial(self._offered, workspace, policy.groups, allowed_tools)
            policies, fixed = self.gate.screen(
                reply.tool_calls, resolve, origin.session_id or tape.session_id or "", depth
            )
            if ASK in policies.values():
                # A person decides first: the turn ends here, holding no worker or model; the
                # decision enters the session like a message and `settle` runs the calls.
                done = {"step": step, "status": "approval", "elapsed_ms": _ms(step_started)}
                await flush()
                request = await self.gate.hold(
                    tape,
                    reply,
                    policies,
                    resolve,
                    origin,
                    (seen_through, turn_id, charge_to.to_json()),
                    [run_event, TapeEntry.event("loop.step", done, context=False)],
                    counting,  # the call that asked is paid for like any other
                )
                self._notify("approval", {"outcome": "requested"})
                self._notify("turn", {"status": "approval"})
                text_ = request.payload["data"]["text"]
                return TurnResult(
                    "approval", text_, request.id, seen_through, step, auto_handed_off,
                    usage_total, request,
                )  # fmt: skip
            if progress is not None:
                names = tuple(self.scrub.text(c["function"]["name"]) for c in reply.tool_calls)
                tell(progress, Progress("tools", tools=names))
            await flush()  # tools may write to the tape (spills, subagents) before the step
            step_entries = await self._run_tools(
                ctx, tape, reply.tool_calls, reply.content, policies, fixed
            )
            step_entries.extend(ctx.records)
            ctx.records = []
            for key, value in ctx.usage.items():
                usage_total[key] = usage_total.get(key, 0) + value
            ctx.usage = {}
            step_entries.append(run_event)
            step_entries.append(
                TapeEntry.event(
                    "loop.step",
                    {"step": step, "status": "continue", "elapsed_ms": _ms(step_started)},
                    context=False,
                )
            )
            if ctx.deferred:
                step_entries.extend(ctx.deferred)
                step_entries.extend(await overflow.turn_user_messages(tape, turn_start))
                ctx.deferred = []
                ctx.handed_off = False
            await write(step_entries, counting)

        note = (
            f"I stopped after {max_steps} steps without a final answer."
            " Ask me to continue, or narrow the request."
        )
        return await self._end(
            write_final,
            "max_steps",
            note,
            step,
            seen_through,
            usage_total,
            auto_handoff=auto_handed_off,
        )

    async def settle(
        self,
        tape: Tape,
        workspace: Path | None = None,
        origin: Origin | None = None,
        *,
        ctx: ToolContext | None = None,
    ) -> int:
        """Settle the tape's decided approval requests (`approval_settle.settle`): their
        calls run once or get a denial the model sees. Returns how many were settled."""
        if ctx is None:
            origin = origin or Origin(session_id=tape.session_id or "")
            policy = self.policies.for_session(origin.session_id or tape.session_id or "")
            ctx = ToolContext(
                tape=tape,
                workspace=workspace or self.settings.workspace,
                settings=self.settings,
                origin=origin,
                groups=policy.groups,
                network=policy.network,
                scrubber=self.scrub,
            )
        session = ctx.origin.session_id or tape.session_id or ""

        def policy_now(name: str) -> str:
            tool = self._offered(ctx.workspace, ctx.groups, None, name)
            return self.gate.decide(tool, name, session)

        return await settle(ctx, tape, self._run_tools, self._notify, policy_now)

    def _offered(
        self,
        workspace: Path,
        groups: frozenset[str] | None,
        allowed: frozenset[str] | None,
        name: str,
    ) -> Tool | None:
        """The tool `name` if this session is offered it (its groups, a subagent's list)."""
        tool = self.tools.get(name, workspace)
        if tool is None or not offered(tool.group, groups):
            return None
        return tool if allowed is None or tool.name in allowed else None

    async def _run_tools(
        self,
        ctx: ToolContext,
        tape: Tape,
        calls: list[dict[str, Any]],
        content: str,
        policies: dict[str, str] | None = None,
        fixed: dict[str, str] | None = None,
    ) -> list[TapeEntry]:
        """Run a step's calls (`tool_step.run_tools`): denied ones get `fixed` text."""
        return await run_tools(
            self.tools,
            self.scrub,
            self.settings.spill_threshold,
            self._notify,
            ctx,
            tape,
            calls,
            content,
            policies,
            fixed,
        )

    async def _end(
        self,
        write: FinalAppend,
        status: str,
        message: str,
        step: int,
        seen_through: int,
        usage: dict[str, int],
        *,
        error: tuple[str, str] | None = None,
        auto_handoff: bool = False,
    ) -> TurnResult:
        """End a turn without a model answer: record why and the note the user gets."""
        entries = []
        if error is not None:
            entries.append(TapeEntry.error(*error))
        entries.append(
            TapeEntry.event(
                "turn.notice",
                {"status": status, "text": message, "seen_through": seen_through},
                context=False,
            )
        )
        written = await write(entries, None)
        self._notify("turn", {"status": status})
        return TurnResult(
            status, message, written[-1].id, seen_through, step, auto_handoff, usage, written[-1]
        )


async def _last_id(tape: Tape) -> int:
    """The tape's newest entry id (0: empty)."""
    newest = await tape.query(limit=1, newest_first=True)
    return newest[0].id or 0 if newest else 0


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)
