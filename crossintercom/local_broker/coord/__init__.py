"""Coordination between sessions beyond sending: acknowledgements, dead letters, inbound
policy, path reservations, aftercare and name retirement, with their frames' handlers."""
