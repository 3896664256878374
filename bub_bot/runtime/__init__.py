"""The runtime: inbound -> session tape -> one turn at a time per session -> reply.

The tape is the queue. `receive` writes the user's message (or command) and its dedupe
keys in one transaction before the channel acknowledges the platform; a per-session
worker then processes whatever is on the tape after the session's cursor, in order. Every
step leaves a fact behind (`reply.sent`, `inbound.done`), so after a crash the worker picks
up exactly where the facts stop: an answer already computed is delivered, not recomputed,
and a message never answered is answered once.

The way of a message, top-down, one module each:

- `core`: the `Runtime`, which builds the parts below and is what channels, the server and
  the CLI call (`receive`, `start`, `resume`, `shutdown`, a session's tape).
- `ingress`: an inbound message becomes an `Arrival` (one entry and its dedupe keys), stored
  in one transaction on the tape `placement` decides (a session's workspace and moves); then
  it wakes the session. Other work that enters a session like a message makes its own
  `Arrival` and goes the same way (`Ingress.enter`).
- `worker`: one task per session with work runs its queue in order, one step at a time:
  a turn (`turns`, shown while written by `streaming`), a command (`command_runner`), or one
  of `recovery`'s (a reply computed before a crash, messages that expired, a failed entry).
- `delivery`: a reply goes out piece by piece, each piece recorded.

Beside the way: `replicas` (the worker's side of the leases when several processes share
one database: take, lose, give back, adopt; leadership and broadcasts), `leases` (their
rules: renewal, giving up before a lease can lapse), `resume` (after a start: which sessions
to wake), `observers` (every part reports its events there, never back through `core`),
`facts` (what the tape says about progress), `session` (in-memory bookkeeping).
"""

from .command_runner import SUMMARY_PROMPT, CommandRunner
from .core import Runtime
from .delivery import Delivery
from .recovery import EXPIRED_NOTE
from .session import Session
from .turns import FAILED_NOTE

__all__ = [
    "EXPIRED_NOTE",
    "FAILED_NOTE",
    "SUMMARY_PROMPT",
    "CommandRunner",
    "Delivery",
    "Runtime",
    "Session",
]
