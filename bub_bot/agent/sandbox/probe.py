"""Which sandbox backend works here: one trivial command through each, once at start."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .base import Backend, CommandSpec, Limits
from .bwrap import BwrapBackend
from .landlock import LandlockBackend, NoSandbox
from .landlock_helper import landlock_abi
from .run import start

log = logging.getLogger("bub_bot.sandbox")

PROBE_TIMEOUT = 10.0
HOW_TO_ENABLE = (
    "bash needs a sandbox: install bubblewrap with user namespaces allowed (Debian: apt-get"
    " install bubblewrap; in Docker run with a seccomp profile that allows unshare/clone of"
    " namespaces), or a kernel with Landlock (5.13+, on by default in most distributions);"
    " BUB_SHELL_SANDBOX=none runs commands unsandboxed (one user's own machine only)"
)


@dataclass
class Availability:
    """The probe's verdict: the backend to use (None: bash is not offered) and why."""

    setting: str
    backend: Backend | None = None
    reasons: dict[str, str] = field(default_factory=dict)
    """Per backend tried: "ok" or what failed."""
    landlock_abi: int = 0

    @property
    def name(self) -> str:
        return self.backend.name if self.backend else "unavailable"

    def why_missing(self) -> str:
        """Why bash is not offered, and how to enable it."""
        tried = "; ".join(f"{k}: {v}" for k, v in self.reasons.items())
        return f"no sandbox works here ({tried}). {HOW_TO_ENABLE}"

    def describe(self) -> str:
        if self.backend is None:
            return self.why_missing()
        if self.backend.name == "none":
            return "UNSANDBOXED (BUB_SHELL_SANDBOX=none): commands run as the bot"
        extra = f", Landlock ABI {self.landlock_abi}" if self.backend.name == "landlock" else ""
        return f"{self.backend.name}{extra}"


async def _works(backend: Backend, uid: int) -> str:
    """ "ok" when `true` runs in `backend` and exits 0; else the launcher's error."""
    with tempfile.TemporaryDirectory(prefix="bub-probe-") as tmp:
        os.chmod(tmp, 0o711)  # as a workspace the sandbox uid can reach (bwrap as root)
        ws = Path(tmp) / "ws"
        ws.mkdir()
        spec = CommandSpec("echo sandbox-ok", ws, limits=Limits(), uid=uid)
        try:
            running = await start(backend.launch(spec), 4096)
            outcome = await running.wait(PROBE_TIMEOUT)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
    if outcome.exit_code == 0 and outcome.output.strip() == "sandbox-ok":
        return "ok"
    text = outcome.output.strip().splitlines()
    detail = text[0] if text else "no output"
    if outcome.timed_out:
        detail = "timed out"
    return f"exit {outcome.exit_code}: {detail[:300]}"


async def probe(
    setting: str, bwrap: str, tmp_root: Path, uid: int, python: str | None = None
) -> Availability:
    """Try the backends `setting` allows (auto: bwrap, then landlock)."""
    found = Availability(setting, landlock_abi=landlock_abi())
    if setting == "none":
        found.backend = NoSandbox()
        found.reasons["none"] = "ok"
        return found
    if setting in ("auto", "bwrap"):
        path = shutil.which(bwrap)
        if path is None:
            found.reasons["bwrap"] = f"{bwrap!r} not found (BUB_SHELL_BWRAP)"
        else:
            backend = BwrapBackend(path)
            found.reasons["bwrap"] = await _works(backend, uid)
            if found.reasons["bwrap"] == "ok":
                found.backend = backend
                return found
    if setting in ("auto", "landlock"):
        if found.landlock_abi < 1:
            found.reasons["landlock"] = "the kernel has no Landlock (ABI 0)"
        else:
            landlock = LandlockBackend(tmp_root, python) if python else LandlockBackend(tmp_root)
            found.reasons["landlock"] = await _works(landlock, uid)
            if found.reasons["landlock"] == "ok":
                found.backend = landlock
    return found


def probe_sync(setting: str, bwrap: str, tmp_root: Path, uid: int) -> Availability:
    """`probe` for callers without an event loop (doctor)."""
    return asyncio.run(probe(setting, bwrap, tmp_root, uid))
