"""The gateway: this host's broker lent over HTTPS to sessions elsewhere
(docs/operations.md#gateway)."""
