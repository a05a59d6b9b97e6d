"""The line monitor (``listen --format line``) and the one-shot ``inbox --unseen`` look.

Both join NAME's session the way every surface does (``auto``: attach to the live session the
MCP server holds, or own it and pull the queued mail), and show each message once.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable

from crossintercom.agents.handover.mail import render_mail_line
from crossintercom.agents.session import AgentSession
from crossintercom.client import Identity
from crossintercom.config import Settings
from crossintercom.inbox import Entry
from crossintercom.inbox_faults import steady, steady_call


def line_writer(as_name: str) -> Callable[[list[Entry]], list[Entry]]:
    # One line per message, each its own notification: every message given is shown.
    def write(entries: list[Entry]) -> list[Entry]:
        for e in entries:
            sys.stdout.write(render_mail_line(e.body, as_name) + "\n")
        sys.stdout.flush()
        return entries

    return write


async def run_line_monitor(settings: Settings, identity: Identity) -> None:
    """Print one line per new message until SIGTERM/SIGINT (a plugin monitor's lifetime)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    write = line_writer(identity.name or identity.id)
    async with AgentSession(settings, identity) as session:
        while not stop.is_set():
            # under its wake policy (docs/agents.md#wake-policy); a failing inbox is waited
            # out, never the end of the monitor (docs/reliability.md)
            if await steady(session.woken, stop.is_set):
                await steady_call(lambda: session.show(write), stop.is_set)
            changed = loop.create_task(session.wait_changed(3600))
            stopped = loop.create_task(stop.wait())
            await asyncio.wait({changed, stopped}, return_when=asyncio.FIRST_COMPLETED)
            for task in (changed, stopped):
                task.cancel()


async def show_unseen_once(
    settings: Settings, identity: Identity, write: Callable[[list[Entry]], list[Entry]]
) -> list[Entry]:
    """Pull the queued mail into the inbox, then show what was never shown (oldest first)."""
    async with AgentSession(settings, identity, watch=False) as session:
        return session.show(write)
