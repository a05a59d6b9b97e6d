"""The broker process: run in the foreground, auto-spawned by a client, its capped log."""
