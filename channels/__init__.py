"""Chat platforms, each behind the small contract in `channels.base`."""
