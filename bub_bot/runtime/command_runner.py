"""Running chat commands (/handoff /reset /status /anchors /tools /skills /schedules
/unschedule /help) on a session's tape.

Every command ends with a reply entry on the tape (`command.done`), whatever happened, so one
bad command can never block the commands and messages queued behind it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .. import commands
from ..agent import Agent, skills, summary_note
from ..agent.model import ModelError
from ..budgets import Payer, step_usage
from ..budgets.report import usage_all_text, usage_text
from ..config import Settings
from ..schedules.book import ScheduleBook, jobs_text
from ..tape import Tape, TapeEntry
from ..toolgroups import TOOL_GROUPS
from .delivery import Delivery
from .session import Session
from .subagents import BackgroundSubagents, status_lines

log = logging.getLogger("bub_bot.runtime")

SUMMARY_PROMPT = (
    "Summarise this conversation phase for whoever continues it: the goal, decisions, facts"
    " and open questions, in a few short bullet points. Reply with the summary only."
)
COMMAND_FAILED_NOTE = "Sorry, that command failed. Nothing was changed; please try again."


class CommandRunner:
    """Runs one command entry of a session and records its reply."""

    def __init__(
        self,
        settings: Settings,
        agent: Agent,
        delivery: Delivery,
        emit: Callable[..., None],
        schedules: ScheduleBook | None = None,
        background: BackgroundSubagents | None = None,
    ) -> None:
        self.settings = settings
        self.agent = agent
        self.delivery = delivery
        self._emit = emit
        self.schedules = schedules
        self.background = background
        """Background subagents (/status lists them, /stop cancels)."""

    async def run(self, session: Session, command: TapeEntry) -> None:
        """Run `command`; a failure of any kind still ends in a recorded reply."""
        data = command.payload.get("data", {})
        # Parse as `receive` did: a leading mention (`@bot /status`) is stripped again.
        names = tuple(data.get("bot_names") or ())
        parsed = commands.parse(str(data.get("text", "")), names, strict_target=False)
        log.info("command.start session=%s command=/%s", session.id, data.get("name", ""))
        if parsed is None or parsed.error:
            text = parsed.error if parsed and parsed.error else commands.help_text()
            await self.reply(session, command, text, ok=False)
            return
        try:
            if parsed.name == "reset":
                await self._reset(session, command)
                return
            text = await self._text(session, parsed, command)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("command.failed session=%s command=/%s", session.id, parsed.name)
            await session.tape.append(
                TapeEntry.error("command", f"/{parsed.name}: {type(exc).__name__}: {exc}")
            )
            await self.reply(session, command, COMMAND_FAILED_NOTE, ok=False)
            return
        self._emit("command", name=parsed.name)
        await self.reply(session, command, text, ok=True)

    async def reply(self, session: Session, command: TapeEntry, text: str, *, ok: bool) -> None:
        """Record a command's reply and deliver it; the reply marks the command done."""
        name = command.payload.get("data", {}).get("name")
        done = await session.tape.append(
            TapeEntry.event(
                "command.done",
                {"name": name, "ok": ok, "text": text, "through": command.id},
                context=False,
            )
        )
        await self.delivery.finish(session, command, done, command.id, fresh=True)

    async def _reset(self, session: Session, command: TapeEntry) -> None:
        """Archive and clear the tape. The reply is written in the reset's own transaction,
        with the command's reply target (the command itself moves to the archive), so a crash
        right after the reset still delivers it: the worker finds it as an unsent reply."""
        target = {
            "channel": command.meta.get("channel", ""),
            "reply_target": command.meta.get("reply_target") or {},
        }

        def reply(archived: str | None) -> TapeEntry:
            text = (
                f"Started a fresh conversation. The previous one is archived as {archived}."
                if archived
                else "Started a fresh conversation (there was nothing to archive)."
            )
            data = {"name": "reset", "ok": True, "text": text, "through": 0, "archived": archived}
            return TapeEntry.event("command.done", data, context=False, **target)

        await session.tape.reset(
            archive=True,
            then=reply,
            carry_inbound_after=command.id,
            workspace=session.workspace,
        )
        session.cursor = 0
        self._emit("command", name="reset")

    async def _text(self, session: Session, command: commands.Command, entry: TapeEntry) -> str:
        tape = session.tape
        payer = Payer.of(session.id, entry.meta)
        if command.name == "handoff":
            return await self._handoff(session, command, payer)
        if command.name == "usage":
            budgets = self.agent.budgets
            if budgets is None:
                return "Usage is not counted here."
            if command.args == "all":
                if not budgets.is_admin(payer.user):
                    return "Only admins (BUB_ADMINS) can see /usage all. /usage shows your own."
                return await usage_all_text(budgets)
            return await usage_text(budgets, payer)
        if command.name == "status":
            info = await tape.info()
            usage = info.last_usage or {}
            text = (
                f"Entries: {info.entries}\nAnchors: {info.anchors}\n"
                f"Last anchor: {info.last_anchor or '-'}\n"
                f"Entries since it: {info.entries_since_anchor}\n"
                f"Last token usage: {_usage_text(usage)}\n"
                f"Workspace: {session.workspace}" + self._jobs_text(session)
            )
            if self.background is not None:
                running = status_lines(await self.background.listed(session.id))
                if running:
                    text += "\nBackground work (stop with /stop <id>):\n" + "\n".join(running)
            return text
        if command.name == "stop":
            if self.background is None:
                return "Nothing runs in the background here."
            stopped = await self.background.stop(session.id, command.args or None)
            if not stopped:
                which = f" {command.args}" if command.args else ""
                return f"No background work{which} is running in this conversation (see /status)."
            return "Stopped: " + ", ".join(stopped) + "."
        if command.name == "anchors":
            anchors = await tape.anchors(command.count)
            lines = [
                f"#{a.id} {a.payload['name']} ({a.date[:19].replace('T', ' ')} UTC)"
                for a in anchors
            ]
            return "Anchors (oldest first):\n" + "\n".join(lines) if lines else "No anchors yet."
        if command.name == "tools":
            await self.agent.tools.prepare(session.workspace)  # as a turn would
            policy = self.agent.policies.for_session(session.id)
            why_off = {
                group: (
                    f"turned off by {policy.narrowed_by} of BUB_WORKSPACE_MAP"
                    if group in self.settings.tools
                    else "turned off (BUB_TOOLS does not list it)"
                )
                for group in TOOL_GROUPS
                if group not in policy.groups
            }
            # Scrubbed like a tool result: a server's reason may quote a configured value.
            text = commands.tools_text(self.agent.tools, session.workspace, policy.groups, why_off)
            return self.agent.scrub.text(text)
        if command.name == "skills":
            found = skills.catalog(session.workspace, self.settings.skills_dir)
            groups = self.agent.policies.for_session(session.id).groups
            offered = any(
                t.name == "skill" for t in self.agent.tools.visible(session.workspace, groups)
            )
            # Skill files are the workspace's text: scrubbed like everything shown from it.
            return self.agent.scrub.text(commands.skills_text(found, offered))
        if command.name in ("schedules", "unschedule"):
            return await self._schedules(session, command)
        return commands.help_text()

    def _jobs_text(self, session: Session) -> str:
        """The session's background jobs (bash), for /status."""
        shell = self.agent.shell
        if shell is None:
            return ""
        jobs = shell.jobs.of(session.tape.name)
        if not jobs:
            return "\nBackground jobs: none"
        lines = [f"\nBackground jobs ({len(jobs)}):"]
        for job in jobs:
            info = job.summary()
            code = f", exit {info['exit_code']}" if "exit_code" in info else ""
            lines.append(f"- {job.id} {job.state}{code} ({info['seconds']} s): {info['cmd']}")
        return self.agent.scrub.text("\n".join(lines))

    async def _schedules(self, session: Session, command: commands.Command) -> str:
        if self.schedules is None:
            return "Scheduled jobs are not available here."
        if command.name == "schedules":
            return jobs_text(await self.schedules.list(session.id))
        removed = await self.schedules.remove(session.id, command.args)
        if removed is None:
            return f"This conversation has no scheduled job {command.args}. See /schedules."
        return f"Removed scheduled job {removed.id}: {removed.data.get('prompt', '')}"

    async def _handoff(self, session: Session, command: commands.Command, payer: Payer) -> str:
        tape: Tape = session.tape
        summary = command.args
        note = ""
        budgets = self.agent.budgets
        spent = await budgets.check(payer) if budgets is not None and not summary else None
        if spent is not None:
            self._emit("refusal", reason=spent.reason)
            note = f" No summary was written: {spent.what()[0].lower()}{spent.what()[1:]}."
        elif not summary:
            try:
                context = await tape.read_messages()
                # `timeout` bounds the whole call (the model client's own deadline).
                reply = await self.agent.model.complete(
                    [*context, {"role": "user", "content": SUMMARY_PROMPT}],
                    timeout=self.settings.handoff_summary_timeout_seconds,
                )
                summary = (reply.content or "").strip()
                if budgets is not None:
                    # A summary counts for whoever asked for the handoff.
                    used = step_usage(reply.usage, context, reply.content or "")
                    await budgets.charge(payer, reply.model, used)
            except (TimeoutError, ModelError) as exc:
                log.warning("handoff.summary_failed session=%s: %s", session.id, exc)
                note = " The model could not write a summary, so this phase starts without one."
        state: dict[str, Any] = {"owner": "human"}
        then: list[TapeEntry] = []
        if summary:
            state["summary"] = summary
            then.append(summary_note(summary))
        await tape.handoff(command.anchor_name, state, then=then)
        if summary:
            return f"Handed off ({command.anchor_name}). Summary carried into the next phase:\n{summary}"
        return f"Handed off ({command.anchor_name}).{note}"


def _usage_text(usage: dict[str, Any]) -> str:
    if not usage:
        return "-"
    parts = [f"{usage.get('prompt_tokens', '?')} in", f"{usage.get('completion_tokens', '?')} out"]
    if usage.get("cached_tokens"):
        parts.append(f"{usage['cached_tokens']} cached")
    return ", ".join(parts)
