"""Escalations to a supervisor: carried as ordinary messages (``escalation``), and the Python
API that sends and answers them (``supervisor``). See docs/agents.md#escalations.
"""
