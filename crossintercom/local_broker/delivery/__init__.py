"""A message's way: resolve, lodge, push or queue here or forward through the relay, and what
the sender is told (docs/delivery.md)."""
