"""A lifeline for every process crossintercom runs for a harness (docs/agents.md#lifeline).

``crossintercom mcp``, ``wait`` and ``listen --format line`` are started by a harness (Claude
Code, Codex, OpenCode, Pi), directly or through ``sh -c``. When the harness ends, however it
ends (normal exit, SIGTERM, SIGKILL), they must end too, within a second or two, or they keep
the session's mailbox held and keep waking a session nobody runs.

:func:`install` arranges that, once, at the start of such a command:

- it finds the harness: the pid in ``CROSSINTERCOM_HARNESS_PID`` when set (a plugin that
  spawns its child can name itself), else the nearest ancestor that is not a shell or a
  launcher (``sh``, ``bash``, ``env``, ``timeout``, …), since hooks run through ``sh -c`` and
  a shell that did not ``exec`` outlives a SIGKILLed harness;
- it asks the kernel for a signal when the direct parent dies (``PR_SET_PDEATHSIG``), and
  watches the harness process itself (a pidfd, polled by a daemon thread); a parent-death
  signal is only acted on once the watched harness (or the direct parent) is really gone,
  because Linux sends it when the parent *thread* that forked us exits, and harnesses run on
  threads;
- when the harness is gone it sends this process SIGTERM, so each command ends the way it ends
  when the harness stops it (``wait`` quietly, with nothing shown; ``listen`` after its current
  step), and ends it hard (``os._exit``) if it is still there :data:`GRACE_S` later.

The MCP stdio server also ends when its stdin reaches end of file (the SDK's stdio transport
does that): a harness closing the pipe without exiting, as Codex's app-server does when it
drops a thread, ends it too. Under Codex's app-server daemon, which outlives the TUI it serves,
the commands also watch that TUI (codex_daemon.py). ``CROSSINTERCOM_LIFELINE=off`` disables
the watch (a debugging aid; nothing relies on it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

# The parent that started this process, noted when this module is first imported: the CLI
# imports it before its slow imports, so a harness that dies while we start is still seen.
FIRST_PARENT = os.getppid()
ENV_HARNESS_PID = "CROSSINTERCOM_HARNESS_PID"
ENV_LIFELINE = "CROSSINTERCOM_LIFELINE"
# After SIGTERM, a command that has not ended this long later is ended hard.
GRACE_S = 2.0
# Without pidfds (old kernels), the watched pid is polled this often.
POLL_S = 0.25
PR_SET_PDEATHSIG = 1
PDEATH_SIGNAL = signal.SIGUSR2
# Processes between a harness and its hook command that are not the harness: shells and the
# launchers a hook line may start with.
LAUNCHERS = frozenset(
    {
        "sh",
        "bash",
        "dash",
        "zsh",
        "ksh",
        "mksh",
        "fish",
        "busybox",
        "env",
        "timeout",
        "nohup",
        "setsid",
        "stdbuf",
        "nice",
        "ionice",
        "sudo",
        "su",
        "doas",
        "uv",
        "uvx",
        "pipx",
    }
)


def parse_pid(raw: str) -> int | None:
    """The pid a setting or a lock file names, or None: ASCII digits only (``int`` also reads
    other scripts' digits, and refuses numbers too long to convert), never 0 or 1."""
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10):
        return None
    pid = int(raw)
    return pid if pid > 1 else None


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(command name, parent pid, start time) of ``pid``; None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None  # exited, not yet reaped: gone for our purpose
    return name, int(fields[1]), int(fields[19])


def _exe_name(pid: int) -> str:
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name
    except OSError:
        return ""


def _is_launcher(pid: int, comm: str) -> bool:
    # The name in /proc/PID/stat is cut at 15 characters and can be a thread's: check both.
    return comm in LAUNCHERS or _exe_name(pid) in LAUNCHERS


def _ancestry() -> tuple[int | None, bool]:
    """(the nearest ancestor that is not a launcher, whether the launchers between us and
    init were orphaned): a shell whose parent is init started us for a harness that is gone."""
    pid, launchers = os.getppid(), 0
    for _ in range(16):
        if pid <= 1:
            return None, launchers > 0
        st = _stat(pid)
        if st is None:
            return None, False
        name, ppid, _start = st
        if not _is_launcher(pid, name):
            return pid, False
        pid, launchers = ppid, launchers + 1
    return None, False


def find_harness(environ: dict[str, str] | None = None) -> int | None:
    """The pid of the harness this process runs for, or None (no parent worth watching)."""
    environ = dict(os.environ) if environ is None else environ
    pid = parse_pid(environ.get(ENV_HARNESS_PID, ""))
    if pid is not None and _stat(pid) is not None:
        return pid
    return _ancestry()[0]


def _set_pdeathsig() -> None:
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(libc_name, use_errno=True).prctl(PR_SET_PDEATHSIG, int(PDEATH_SIGNAL), 0, 0, 0)


class Lifeline:
    """Ends this process when the watched harness (or the direct parent) is gone."""

    def __init__(
        self,
        harness: int | None,
        end: Callable[[], None] | None = None,
        *,
        watch_input: bool = False,
        detached: bool = False,
    ) -> None:
        self.harness = harness
        self.watch_input = watch_input
        # Started detached by a hook that returned at once: the parent is gone by design.
        self.detached = detached
        self.parent = os.getppid()
        st = _stat(harness) if harness else None
        self._start = st[2] if st else None
        self._end = end or _terminate
        self._ended = threading.Event()

    def gone(self) -> bool:
        """The harness or our direct parent ended (a reused pid counts as ended)."""
        if not self.detached and os.getppid() != self.parent:
            return True
        if self.harness is None:
            return False
        st = _stat(self.harness)
        return st is None or st[2] != self._start

    def check(self) -> None:
        if self.gone() and not self._ended.is_set():
            self._ended.set()
            self._end()

    def _watch(self) -> None:
        poller = select.poll()
        fds: list[int] = []
        inpipe = None
        if self.harness is not None:
            with contextlib.suppress(OSError, AttributeError):
                fds.append(os.pidfd_open(self.harness))
                poller.register(fds[-1], select.POLLIN)  # readable once the harness exits
            if self.watch_input and (inpipe := _input_pipe(self.harness)) is not None:
                fds.append(inpipe)
                poller.register(inpipe, 0)  # reports only POLLHUP: the last writer closed it
        try:
            while not self._ended.is_set():
                # The timeout also catches the direct parent (a shell between us and the
                # harness) going away, and serves kernels without pidfds.
                events = poller.poll(1000 if fds else POLL_S * 1000)
                if any(fd == inpipe and ev & select.POLLHUP for fd, ev in events):
                    self._ended.set()  # the harness's input ended: it is shutting down
                    self._end()
                    return
                self.check()
        finally:
            for fd in fds:
                os.close(fd)

    def start(self) -> Lifeline:
        if self.detached:
            self.check()
            threading.Thread(target=self._watch, name="crossintercom-lifeline", daemon=True).start()
            return self
        if self.parent <= 1:
            return self  # started by init or a subreaper on purpose: nothing to outlive
        with contextlib.suppress(ValueError):  # not the main thread: the watch still runs
            signal.signal(PDEATH_SIGNAL, lambda _sig, _frame: self.check())
            _set_pdeathsig()
        self.check()  # the parent may have died before the signal was asked for
        threading.Thread(target=self._watch, name="crossintercom-lifeline", daemon=True).start()
        return self


def _input_pipe(pid: int) -> int | None:
    """A read end of the pipe the harness reads its input from, or None when its stdin is not
    a pipe (a terminal, /dev/null). It is only polled for hang-up, never read."""
    path = f"/proc/{pid}/fd/0"
    try:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            return None
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None


def _terminate() -> None:
    """End this process as the harness would: SIGTERM, then hard after GRACE_S."""

    def hard() -> None:
        time.sleep(GRACE_S)
        os._exit(143)

    threading.Thread(target=hard, name="crossintercom-lifeline-exit", daemon=True).start()
    os.kill(os.getpid(), signal.SIGTERM)


def terminate() -> None:
    """End this process now, as its harness ending would (SIGTERM, then hard)."""
    _terminate()


def install(
    environ: dict[str, str] | None = None,
    *,
    watch_input: bool = False,
    hook: bool = False,
    detached: bool = False,
) -> Lifeline | None:
    """Tie this process's life to its harness's; None when disabled.

    ``watch_input``: also end when the harness's stdin pipe loses its last writer (a harness
    that reads a stream, as Claude Code's ``--input-format stream-json``, whose input ended:
    it is about to exit, but may first wait for this process). ``hook``: this is a harness's
    hook, never a container's or a service's main process, so being init's child means the
    harness is gone. ``detached``: a hook started this process detached and returned at once
    (Claude Code's messaging-socket child): only the harness named in
    ``CROSSINTERCOM_HARNESS_PID`` is watched, and without one the process ends at once.
    """
    environ = dict(os.environ) if environ is None else environ
    if environ.get(ENV_LIFELINE, "").lower() in ("off", "0", "no"):
        return None
    named = parse_pid(environ.get(ENV_HARNESS_PID, ""))
    if named is not None and _stat(named) is None:
        # The harness that started us ended while we were starting (a plugin's waiter spawned
        # as its host quits): we may already be init's child, so there is nothing left to watch.
        _terminate()
        return None
    if detached:
        if named is None:
            _terminate()
            return None
        return Lifeline(named, detached=True).start()
    # A hook that is init's child, or whose shell is, lost its harness before it could note it
    # (in its first tenth of a second). An MCP server may be run by a container's init
    # (`docker run --init`), through a shell or not: it has the end of its stdin instead.
    orphan = hook and (os.getppid() == 1 or (not named and _ancestry()[1]))
    if orphan or os.getppid() != FIRST_PARENT:
        # Likewise when the process that started us is gone already, or a hook's shell is
        # left orphaned: the harness went first.
        _terminate()
        return None
    return Lifeline(find_harness(environ), watch_input=watch_input).start()
