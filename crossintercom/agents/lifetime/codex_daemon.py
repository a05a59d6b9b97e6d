"""The Codex TUI a daemon-hosted Codex session runs for (docs/agents.md#codex).

Codex 0.171's TUI runs its sessions in a shared app-server daemon (``codex app-server
--listen unix:// --managed-daemon``): the Stop hook and the MCP server are the daemon's
children, not the TUI's. When the TUI quits (``/quit``, SIGTERM, SIGKILL) the daemon keeps
the thread's turn running ("Any running work continues"), so a waiting hook would keep that
turn open and wake it for the next mail with no one watching, and the daemon unloads the
thread (ending its MCP server) only once it is idle with no client for
``thread_unload_delay_secs`` (30 minutes by default).

Neither the hook's input nor its environment names the TUI: the daemon hands its children
the environment of whichever ``codex`` started it. What does tell is the process table: the
TUI is a ``codex`` process, not an app-server, working in the session's directory (its own
working directory, or the one it was given with ``-C``/``--cd``). A
child started under such a daemon watches every such TUI and ends when the last is gone; when
there is none (the TUI quit while the child started) it ends at once unless the daemon still
has a client attached (an IDE or the desktop app, which may be the session's).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

POLL_S = 0.25


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _link(pid: int, name: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/{name}")
    except OSError:
        return ""


def is_daemon(pid: int | None) -> bool:
    """``pid`` is a Codex app-server serving clients over a socket (its daemon), not a plain
    ``codex app-server`` on stdio (whose client ends it by closing its input)."""
    if pid is None:
        return False
    argv = _argv(pid)
    if not argv or not Path(argv[0]).name.startswith("codex") or "app-server" not in argv:
        return False
    return any(a == "--managed-daemon" or a.startswith("--listen") for a in argv)


def _workdir(pid: int, argv: list[str]) -> str:
    """Where the TUI works: its ``-C``/``--cd`` directory, else its own working directory."""
    cwd = _link(pid, "cwd")
    # Each option beside the word after it; an empty argv (a process exiting as it is read)
    # has none.
    for opt, value in zip(argv, [*argv[1:], ""][: len(argv)], strict=True):
        if opt in ("-C", "--cd") and value:
            return os.path.realpath(os.path.join(cwd, value))
        if opt.startswith("--cd="):
            return os.path.realpath(os.path.join(cwd, opt[5:]))
    return cwd


def _is_tui(pid: int, cwd: str) -> bool:
    if Path(_link(pid, "exe")).name != "codex":
        return False
    argv = _argv(pid)[1:]
    # The daemon itself, its updater, `codex exec` and the other subcommands are not a TUI.
    if any(a in ("app-server", "exec", "e", "mcp-server", "exec-server") for a in argv):
        return False
    return _workdir(pid, argv) == cwd


def clients(cwd: str) -> list[int]:
    """Pids of the Codex TUIs whose working directory is ``cwd``."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != me and _is_tui(int(entry.name), cwd):
            found.append(int(entry.name))
    return found


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = _link(pid, f"fd/{fd}")
            if target.startswith("socket:["):
                found.add(target[8:-1])
    return found


def has_clients(daemon: int) -> bool:
    """The daemon holds a connection accepted on its listening socket: some client (a TUI, an
    IDE, the desktop app) is attached. Accepted sockets carry the listener's path in
    /proc/net/unix; a listener is flagged ``__SO_ACCEPTCON`` (00010000)."""
    inodes = _socket_inodes(daemon)
    try:
        rows = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        return True  # cannot tell: assume someone is there
    listening, connected = set(), []
    for row in rows:
        cols = row.split()
        if len(cols) < 8 or cols[6] not in inodes:
            continue
        if cols[3] == "00010000":
            listening.add(cols[7])
        else:
            connected.append(cols[7])
    return any(path in listening for path in connected)


def _start_time(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def watch(pids: list[int], end: Callable[[], None]) -> threading.Thread:
    """Call ``end`` once every process in ``pids`` is gone (a reused pid counts as gone)."""
    started = {pid: _start_time(pid) for pid in pids}

    def run() -> None:
        def alive(pid: int, start: str | None) -> bool:
            return start is not None and _start_time(pid) == start

        while any(alive(pid, start) for pid, start in started.items()):
            time.sleep(POLL_S)
        end()

    thread = threading.Thread(target=run, name="crossintercom-codex-tui", daemon=True)
    thread.start()
    return thread


def tie_to_tui(harness: int | None, cwd: str | None, end: Callable[[], None]) -> list[int]:
    """Under a Codex daemon, end (``end``) when the TUIs working in ``cwd`` are gone; the
    pids watched, or [] (not under a daemon, or no TUI found: nothing more to watch)."""
    if not is_daemon(harness):
        return []
    with contextlib.suppress(OSError):
        cwd = os.path.realpath(cwd or os.getcwd())
    tuis = clients(cwd or "")
    if tuis:
        watch(tuis, end)
    elif harness is not None and not has_clients(harness):
        end()  # the TUI quit while this process started, and no other client is attached
    return tuis
