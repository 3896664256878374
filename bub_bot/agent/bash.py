"""The `bash`, `bash.output` and `bash.kill` tools: every command in a sandbox, one per command.

A non-zero exit is a normal result (the model sees the code); a sandbox that fails to start
a command is an error result — never a retry without the sandbox. When no sandbox works
(BUB_SHELL_SANDBOX=auto) the tools are not offered and /tools, doctor, /readyz and the start-up
log say why.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from ..config import ConfigError, Settings
from ..hardening import no_dump
from .sandbox import (
    Availability,
    CommandSpec,
    Limits,
    Outcome,
    SandboxStartError,
    probe,
    start_failure,
)
from .sandbox import start as start_command
from .sandbox.jobs import JobTable, recorded
from .tools import ToolContext, ToolError, ToolRegistry

log = logging.getLogger("bub_bot.sandbox")

DEFAULT_TIMEOUT = 30.0
TOOL_NAMES = ("bash", "bash.output", "bash.kill")


class Shell:
    """The sandbox chosen at start, its limits, and the background jobs."""

    def __init__(self, settings: Settings, availability: Availability) -> None:
        self.settings = settings
        self.availability = availability
        self.jobs = JobTable(keep_bytes=settings.shell_max_output * 4)
        self.limits = Limits(
            cpu_seconds=settings.shell_cpu_seconds,
            memory_mb=settings.shell_memory_mb,
            file_mb=settings.shell_file_mb,
            nofile=settings.shell_nofile,
            nproc=settings.shell_nproc,
            tmp_mb=settings.shell_tmp_mb,
        )

    def spec(self, ctx: ToolContext, cmd: str) -> CommandSpec:
        workspace = Path(ctx.workspace).resolve()
        workspace.mkdir(parents=True, exist_ok=True)
        shared = self.settings.shell_uid
        uid = self.settings.shell_uid_for(workspace)
        return CommandSpec(cmd, workspace, ctx.network, self.limits, uid, inside_uid=shared)

    def timeout(self, asked: float | None, default: float) -> float:
        most = self.settings.shell_timeout_max
        value = default if asked is None else asked
        if value > most:
            raise ToolError(
                f"timeout_seconds {value:g} is above the limit BUB_SHELL_TIMEOUT_MAX={most:g}"
            )
        return value

    async def start(self, ctx: ToolContext, cmd: str) -> Any:
        backend = self.availability.backend
        if backend is None:  # not offered; a stale call still gets a clear refusal
            raise ToolError(self.availability.why_missing())
        try:
            launch = backend.launch(self.spec(ctx, cmd))
            return await start_command(launch, self.settings.shell_max_output)
        except (OSError, SandboxStartError) as exc:
            raise self._start_error(str(exc)) from None

    def _start_error(self, detail: str) -> ToolError:
        name = self.availability.name
        log.error("bash.sandbox_failed backend=%s: %s", name, detail)
        return ToolError(
            f"the sandbox ({name}) could not start the command, so it did not run"
            f" (it is never run without the sandbox): {detail}"
        )

    async def run(self, ctx: ToolContext, cmd: str, timeout: float) -> dict[str, Any]:
        running = await self.start(ctx, cmd)
        outcome = await running.wait(timeout)
        failure = start_failure(outcome)
        if failure is not None:
            raise self._start_error(failure)
        log.info(
            "bash.run session=%s exit=%s timed_out=%s bytes=%d",
            ctx.origin.session_id or ctx.tape.session_id,
            outcome.exit_code,
            outcome.timed_out,
            outcome.output_bytes,
        )
        return result(outcome, timeout)

    async def close(self) -> None:
        """Shutdown: stop the background jobs (recorded on their tapes)."""
        await self.jobs.close()


def result(outcome: Outcome, timeout: float) -> dict[str, Any]:
    """A command's result as the model sees it."""
    found: dict[str, Any] = {"exit_code": outcome.exit_code, "output": outcome.output}
    if outcome.timed_out:
        found["timed_out"] = True
        found["note"] = (
            f"the command was stopped after {timeout:g} s (timeout_seconds), with every"
            " process it started; the output is what it wrote until then"
        )
    elif outcome.exit_code is not None and outcome.exit_code > 128:
        found["note"] = f"the command was killed by signal {outcome.exit_code - 128}"
    if outcome.truncated:
        found["output_truncated"] = True
    return found


def register_bash(registry: ToolRegistry, shell: Shell) -> None:
    """Add bash, bash.output and bash.kill to `registry`."""

    @registry.tool("bash")
    async def bash(
        ctx: ToolContext,
        cmd: Annotated[str, Field(min_length=1, description="a /bin/sh command line")],
        timeout_seconds: Annotated[
            float | None,
            Field(
                gt=0,
                description="stop it after this many seconds (default 30; background: the maximum)",
            ),
        ] = None,
        background: Annotated[
            bool, Field(description="start it and return a job_id (see bash_output, bash_kill)")
        ] = False,
    ) -> dict[str, Any]:
        """Run a shell command in a sandbox: the workspace is the working directory (read-write), system directories are read-only, /tmp is private, there is no network unless the operator enabled it, and nothing else of the machine is visible. Returns exit_code and output (stdout and stderr)."""
        if not background:
            return await shell.run(ctx, cmd, shell.timeout(timeout_seconds, DEFAULT_TIMEOUT))
        limit = shell.settings.shell_max_jobs
        if shell.jobs.running(ctx.tape.name) >= limit:
            raise ToolError(
                f"this conversation already runs {limit} background jobs"
                " (BUB_SHELL_MAX_JOBS): wait for one or stop it with bash_kill"
            )
        timeout = shell.timeout(timeout_seconds, shell.settings.shell_timeout_max)
        running = await shell.start(ctx, cmd)
        session = ctx.origin.session_id or ctx.tape.session_id or ""
        job = await shell.jobs.add(ctx.tape, session, cmd, running, timeout)
        return {
            "job_id": job.id,
            "state": "running",
            "note": f"started in the background; read its output with bash_output(job_id={job.id!r})",
        }

    @registry.tool("bash.output")
    async def bash_output(
        ctx: ToolContext,
        job_id: Annotated[str, Field(min_length=1, max_length=64)],
        offset: Annotated[int, Field(ge=0, description="first byte of output to return")] = 0,
    ) -> dict[str, Any]:
        """The output of a background job from `offset`, its state and, once it ended, its exit code."""
        job = shell.jobs.jobs.get(job_id)
        if job is None or job.tape.name != ctx.tape.name:
            return await _old_job(ctx, job_id)
        chunk = bytes(job.buffer[offset : offset + shell.settings.shell_max_output])
        found = job.summary()
        found["output"] = chunk.decode("utf-8", "replace")
        found["next_offset"] = offset + len(chunk)
        if job.dropped and found["next_offset"] >= len(job.buffer):
            found["note"] = f"{job.dropped} bytes after the first {len(job.buffer)} were dropped"
        return found

    @registry.tool("bash.kill")
    async def bash_kill(
        ctx: ToolContext, job_id: Annotated[str, Field(min_length=1, max_length=64)]
    ) -> dict[str, Any]:
        """Stop a background job and every process it started."""
        job = shell.jobs.jobs.get(job_id)
        if job is None or job.tape.name != ctx.tape.name:
            return await _old_job(ctx, job_id)
        await shell.jobs.kill(job)
        return job.summary()


async def _old_job(ctx: ToolContext, job_id: str) -> dict[str, Any]:
    """A job this process does not run: what the tape recorded of it."""
    data = await recorded(ctx.tape, job_id)
    if data is None:
        raise ToolError(f"no background job {job_id!r} in this conversation")
    if data.get("state") == "running":
        return {
            "job_id": job_id,
            "state": "stopped_by_restart",
            "note": "the bot restarted while this job ran: it was stopped and its output is gone",
        }
    found = {"job_id": job_id, "state": data.get("state"), "exit_code": data.get("exit_code")}
    found["output_tail"] = data.get("output_tail", "")
    found["note"] = "this job ended earlier; only the end of its output was kept (on the tape)"
    return found


async def install_bash(registry: ToolRegistry, settings: Settings) -> Shell | None:
    """Probe the sandbox and offer bash when one works. A forced backend
    (BUB_SHELL_SANDBOX=bwrap|landlock) that cannot work is a ConfigError; none warns."""
    if "bash" not in settings.tools:
        for name in TOOL_NAMES:
            registry.missing[name] = "turned off (BUB_TOOLS does not list bash)"
        return None
    # Not under BUB_HOME: the sandbox uid must be able to reach its TMPDIR by path.
    tmp_root = Path(tempfile.gettempdir()) / "bub-sandbox"
    found = await probe(settings.shell_sandbox, settings.shell_bwrap, tmp_root, probe_uid(settings))
    if found.backend is None:
        why = found.why_missing()
        if settings.shell_sandbox != "auto":
            raise ConfigError(f"BUB_SHELL_SANDBOX={settings.shell_sandbox} cannot work here: {why}")
        log.warning("bash.unavailable: %s", why)
        for name in TOOL_NAMES:
            registry.missing[name] = why
        return None
    if found.backend.name == "none":
        log.warning(
            "bash.UNSANDBOXED BUB_SHELL_SANDBOX=none: commands run as the bot with its files"
            " (for one user's own machine only)"
        )
    elif found.backend.name == "landlock" and os.geteuid() != 0:
        # Same uid as the commands: hide /proc/<bot>/environ from them (main() did it
        # already for the `bub-bot` script; this covers a bot embedded another way).
        no_dump()
    log.info("bash.sandbox backend=%s", found.describe())
    shell = Shell(settings, found)
    register_bash(registry, shell)
    return shell


def probe_uid(settings: Settings) -> int:
    """The uid the start-up probe runs as: the top of BUB_SHELL_UIDS when set (a uid this
    machine cannot switch to, as in a rootless container, then fails the probe, not a
    command later), else BUB_SHELL_UID."""
    found = settings.shell_uid_range
    return found[1] if found else settings.shell_uid
