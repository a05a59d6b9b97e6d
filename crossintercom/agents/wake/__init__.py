"""Waking a session when mail arrives: ``crossintercom wait`` (``waiter``) and its output per
harness (``hooks``), Claude Code's messaging socket (``claude_socket``), and the line monitor
(``monitor``). See docs/agents.md#wait.
"""
