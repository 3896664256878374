"""The agent: model client, tools, spill sidecar, and the turn loop."""

from .builtin import default_registry, summary_note
from .loop import Agent
from .model import ContextOverflow, ModelClient, ModelError, ModelReply, is_context_overflow
from .overflow import AUTO_HANDOFF_ANCHOR
from .streaming import Progress, ProgressCallback
from .tools import Origin, Tool, ToolContext, ToolError, ToolRegistry
from .turn_writes import TurnResult

__all__ = [
    "AUTO_HANDOFF_ANCHOR",
    "Agent",
    "ContextOverflow",
    "ModelClient",
    "ModelError",
    "ModelReply",
    "Origin",
    "Progress",
    "ProgressCallback",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "TurnResult",
    "default_registry",
    "is_context_overflow",
    "summary_note",
]
