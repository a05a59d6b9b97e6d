"""Mail to a busy Claude Code session through its messaging socket (docs/agents.md#claude-code).

Claude Code 2.1.332 exports a per-session Unix socket to its hooks and their children
(``CLAUDE_CODE_MESSAGING_SOCKET``, with ``CLAUDE_CODE_MESSAGING_TOKEN``). It takes JSON lines,
``{"type": "auth", "token": TOKEN}`` then ``{"type": "user", "message": {"role": "user",
"content": TEXT}}``, and shows TEXT to the model at its next step, mid-turn too, as a message
from another session, not from the user.

``crossintercom wait --format claude-socket`` runs as a SessionStart hook. The hook returns at
once: it starts itself again detached from the hook's pipes (``CROSSINTERCOM_SOCKET_CHILD``),
tied by the lifeline to Claude Code's pid (``CLAUDE_PID``). That child waits for the session's
mail as ``wait`` does and writes each hand-over, framed, to the socket; it is marked shown only
once the write succeeded (the show lock keeps each message shown once beside the Stop hook).
Without the socket, or when it refuses a connection or a write, the child ends and the
``asyncRewake`` Stop hook is the path.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable

from crossintercom.agents.handover.mail import fit_unseen
from crossintercom.client import Identity
from crossintercom.config import Settings
from crossintercom.inbox import Entry

ENV_SOCKET = "CLAUDE_CODE_MESSAGING_SOCKET"
ENV_TOKEN = "CLAUDE_CODE_MESSAGING_TOKEN"
ENV_CLAUDE_PID = "CLAUDE_PID"
ENV_CHILD = "CROSSINTERCOM_SOCKET_CHILD"
# How long one delivery may take (connect, both lines, the socket's answer or its close).
SEND_TIMEOUT_S = 5.0
# The child waits for mail for as long as Claude Code runs (its lifeline ends it).
FOREVER_S = 365 * 86400.0


def target(environ: dict[str, str]) -> tuple[str, str] | None:
    """(socket path, token) when Claude Code exported its messaging socket and it is there,
    else None."""
    path, token = environ.get(ENV_SOCKET, ""), environ.get(ENV_TOKEN, "")
    try:
        there = stat.S_ISSOCK(os.stat(path).st_mode) if path else False
    except OSError:
        there = False
    return (path, token) if there and token else None


def deliver(path: str, token: str, text: str, timeout: float = SEND_TIMEOUT_S) -> None:
    """Send ``text`` into the session; raises OSError when the socket refuses it."""
    lines = [
        {"type": "auth", "token": token},
        {"type": "user", "message": {"role": "user", "content": text}},
    ]
    data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        # 2.1.332 closes the connection once it took the message; a reset means refused.
        try:
            while sock.recv(4096):
                pass
        except TimeoutError:
            pass


def socket_writer(
    path: str, token: str, as_name: str | None
) -> Callable[[list[Entry]], list[Entry]]:
    """Writes what fits one hand-over (docs/agents.md#one-hand-over); the rest stays unseen and
    goes in the next one, at once."""

    def write(entries: list[Entry]) -> list[Entry]:
        mail, shown = fit_unseen(entries, as_name)
        deliver(path, token, mail)
        return shown

    return write


def start_child(environ: dict[str, str]) -> bool:
    """From the SessionStart hook: start this command again, detached, as the delivery child.
    False (nothing started) without the socket or without Claude Code's pid to watch."""
    from crossintercom.agents.lifetime.lifeline import ENV_HARNESS_PID, parse_pid

    pid = parse_pid(environ.get(ENV_CLAUDE_PID, ""))
    if target(environ) is None or pid is None:
        return False
    env = {**environ, ENV_CHILD: "1", ENV_HARNESS_PID: str(pid)}
    subprocess.Popen(
        [sys.executable, "-m", "crossintercom.cli.main", *sys.argv[1:]],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    return True


async def deliver_all(
    settings: Settings, identity: Identity, path: str, token: str, *, quiet: float
) -> None:
    """The child's loop: each hand-over of mail into the socket, until Claude Code ends (the
    lifeline's SIGTERM) or the socket refuses a delivery (the Stop hook takes over)."""
    from crossintercom.agents.wake.waiter import wait_for_mail

    write = socket_writer(path, token, identity.name)
    while True:
        try:
            got = await wait_for_mail(
                settings,
                identity,
                write,
                timeout=FOREVER_S,
                quiet=quiet,
                replace=True,
                lock="socket",
            )
        except OSError:
            return  # refused: the mail stays unseen for the Stop hook
        if not got:
            return  # stopped (SIGTERM): Claude Code ended, or a newer child took over
