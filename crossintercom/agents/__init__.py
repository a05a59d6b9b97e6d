"""Agents in their harnesses: the MCP server, the wake commands, harness setup, escalations.

Everything here is a client like any other: it talks to the local broker through the public
``Client``/``AsyncClient`` API and reads the session's durable ``Inbox``; it never touches the
broker's internals, the relay or the store. See docs/agents.md.
"""
