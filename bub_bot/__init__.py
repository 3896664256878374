"""bub-bot: a chat-channel bot server built on append-only SQLite tapes."""

__version__ = "0.1.0"
