"""`crossintercom mcp --as NAME`: the mailbox as MCP tools (``server``), offered by profile
(``profiles``), answered as tool results (``results``), one module of tools per concept
(``*_tools``). See docs/agents.md#the-mcp-server.
"""
