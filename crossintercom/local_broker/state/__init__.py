"""``broker.sqlite``: the broker's durable state and its versioned schema."""
