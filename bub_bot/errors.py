"""Errors the core's layers share (below the settings, so every parser of a setting can raise
them without importing the settings)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is missing or invalid; the message names the variable."""
