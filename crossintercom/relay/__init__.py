"""The relay: this host's only link to the shared store."""
