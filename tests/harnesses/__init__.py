"""Tests against the real harness CLIs (Claude Code, Codex, OpenCode, Pi) and a mock model server.

install.py pins and installs the CLIs, mockmodel.py is the model server, kits.py points each
harness at it, conftest.py has the fixtures (docs/agents.md, "Tested against").
"""
