"""The runtime: inbound -> session tape -> one turn at a time per session -> reply.

The tape is the queue. `receive` writes the user's message (or command) and its dedupe
keys in one transaction before the channel acknowledges the platform; a per-session
worker then processes whatever is on the tape after the session's cursor, in order. Every
step leaves a fact behind (`reply.sent`, `inbound.done`), so after a crash the worker picks
up exactly where the facts stop: an answer already computed is delivered, not recomputed,
and a message never answered is answered once.

Modules by job: `core` (ingress, the session worker, resume, shutdown), `turns` (one turn
with the agent), `placement` (a session's workspace and moves), `leases` (replicas), `facts`
(what the tape says about progress), `delivery` (sending and recording reply pieces),
`command_runner` (chat commands), `session` (in-memory bookkeeping).
"""

from .command_runner import SUMMARY_PROMPT, CommandRunner
from .core import EXPIRED_NOTE, FAILED_NOTE, Runtime
from .delivery import Delivery
from .session import Session

__all__ = [
    "EXPIRED_NOTE",
    "FAILED_NOTE",
    "SUMMARY_PROMPT",
    "CommandRunner",
    "Delivery",
    "Runtime",
    "Session",
]
