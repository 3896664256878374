"""Approvals: which tool calls a person must approve in chat (`policy`), the request bound to
the exact calls (`requests`), and its expiry as a durable job (`expiry`)."""
