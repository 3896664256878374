"""The web chat channel (the embedded default) and the read-only tape viewer."""

from .channel import WebChannel

__all__ = ["WebChannel"]
