"""Sandboxes for the bash tool: bubblewrap, else a Landlock helper, never silently none."""

from .base import CommandSpec, Launch, Limits
from .probe import Availability, probe
from .run import Outcome, SandboxStartError, start, start_failure

__all__ = [
    "Availability",
    "CommandSpec",
    "Launch",
    "Limits",
    "Outcome",
    "SandboxStartError",
    "probe",
    "start",
    "start_failure",
]
