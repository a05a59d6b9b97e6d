"""`crossintercom demo`, `bench` and `chaos`: showcase and measuring tools over simulated hosts.

Each tool imports only ``harness`` (the simulated hosts) and ``common`` (store and scratch dir),
never another tool.
"""
