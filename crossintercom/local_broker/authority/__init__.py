"""The per-host dedup authority: its records, its files and format, and its group commit."""
