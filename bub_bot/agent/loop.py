"""The turn loop: context from the tape -> model -> tools -> tape, until the model answers."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ..budgets import Budgets
from ..config import Settings
from ..secrets import Scrubber
from ..tape import Tape, TapeEntry, default_selector, visible
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
from .turn_writes import TurnResult, TurnWrites, ms_since, run_record, step_event

log = logging.getLogger(__name__)

EntryFilter = Callable[[list[TapeEntry]], list[TapeEntry]]


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
        bootstrapped: bool = False,
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
        again); `bootstrapped`: the tape has its anchor already (the runtime's ingress wrote it),
        so no write looks for one.
        """
        workspace = workspace or self.settings.workspace
        selector = selector or self.selector
        started_turn = time.perf_counter()
        writes = TurnWrites(tape, bootstrapped)
        turn_start = await writes.begin(
            new_messages, turn_id, payer, progress is not None, turn_start
        )

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
                return await writes.notice(
                    self._notify,
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
                elapsed = ms_since(step_started)
                await writes.flush()
                if auto_handed_off:
                    await overflow.past_too_long(tape, exc, seen_through)
                    return await writes.notice(
                        self._notify,
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
                await writes.write([step_event(step, "error", step_started)])
                return await writes.notice(
                    self._notify,
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
            run_event = run_record(reply, step, turn_id, payer)
            if not reply.tool_calls:
                answer = await writes.answer(
                    reply,
                    run_event,
                    counting,
                    turn_id=turn_id,
                    step=step,
                    seen_through=seen_through,
                    step_started=step_started,
                )
                self._notify("turn", {"status": "ok", "elapsed_ms": ms_since(started_turn)})
                return TurnResult(
                    "ok",
                    reply.content,
                    answer.id,
                    seen_through,
                    step,
                    auto_handed_off,
                    usage_total,
                    answer,
                )

            # Only tools this session is offered are asked about (others fail as unknown).
            resolve = partial(self._offered, workspace, policy.groups, allowed_tools)
            policies, fixed = self.gate.screen(
                reply.tool_calls, resolve, origin.session_id or tape.session_id or "", depth
            )
            if ASK in policies.values():
                # A person decides first: the turn ends here, holding no worker or model; the
                # decision enters the session like a message and `settle` runs the calls.
                done = step_event(step, "approval", step_started)
                await writes.flush()
                request = await self.gate.hold(
                    tape,
                    reply,
                    policies,
                    resolve,
                    origin,
                    (seen_through, turn_id, charge_to.to_json()),
                    [run_event, done],
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
            await writes.flush()  # tools may write to the tape (spills, subagents) before the step
            step_entries = await self._run_tools(
                ctx, tape, reply.tool_calls, reply.content, policies, fixed
            )
            step_entries.extend(ctx.records)
            ctx.records = []
            for key, value in ctx.usage.items():
                usage_total[key] = usage_total.get(key, 0) + value
            ctx.usage = {}
            step_entries.append(run_event)
            step_entries.append(step_event(step, "continue", step_started))
            if ctx.deferred:
                step_entries.extend(ctx.deferred)
                step_entries.extend(await overflow.turn_user_messages(tape, turn_start))
                ctx.deferred = []
                ctx.handed_off = False
            await writes.write(step_entries, counting)

        note = (
            f"I stopped after {max_steps} steps without a final answer."
            " Ask me to continue, or narrow the request."
        )
        return await writes.notice(
            self._notify,
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
