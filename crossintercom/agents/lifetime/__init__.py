"""How long a process run for a harness lives: it ends with the harness (``lifeline``), and
under Codex's app-server daemon with the TUI it serves (``codex_daemon``). See
docs/agents.md#lifeline.
"""
