"""The TCP forwarder the fault tests put between a relay and PostgreSQL: the one `crossintercom
chaos` runs, so the tests and the chaos run fault connections the same way."""

from __future__ import annotations

from crossintercom.tools.proxy import TcpProxy

__all__ = ["TcpProxy"]
