"""What a session may use, as the operator decided: BUB_TOOLS narrowed by the workspace rule
matching the session now (`tools`), and whether its commands get the network (`network`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Settings
from ..workspaces import WorkspaceMap, load_workspace_map


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """The groups offered in a session and its network switch; `narrowed_by` names the rule
    that took groups away (for /tools)."""

    groups: frozenset[str]
    network: bool = False
    narrowed_by: str = ""


class Policies:
    """The policy of each session, from the settings and BUB_WORKSPACE_MAP."""

    def __init__(self, settings: Settings, workspaces: WorkspaceMap | None = None) -> None:
        self.settings = settings
        self.workspaces = workspaces or load_workspace_map(
            settings.workspace_map, settings.workspace
        )

    def for_session(self, session_id: str) -> ToolPolicy:
        """The policy of `session_id` (the first matching rule decides)."""
        groups = frozenset(self.settings.tools)
        rule = self.workspaces.rule_for(session_id) if session_id else None
        if rule is None:
            return ToolPolicy(groups)
        narrowed = ""
        if rule.tools is not None:
            allowed = groups & frozenset(rule.tools)
            if allowed != groups:
                narrowed = f"workspace rule {rule.index + 1} (match {rule.match!r})"
            groups = allowed
        return ToolPolicy(groups, rule.network, narrowed)
