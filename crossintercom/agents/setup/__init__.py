"""`crossintercom setup HARNESS`: one writer per harness (``claude``, ``codex``, ``opencode``,
``pi``), what they share (``common``), and the pick among them (``harnesses``); the OpenCode
plugin and the Pi extension ship beside them as package data. See
docs/agents.md#harness-recipes.
"""
