"""The output formats of ``crossintercom wait``, each fitted to the harness that runs it.

Exit codes and outputs (docs/agents.md#wait):

| format        | mail                                         | timeout        | busy | error |
| ------------- | -------------------------------------------- | -------------- | ---- | ----- |
| `json`        | 0, JSON array of message objects on stdout   | 6, `[]`        | 7    | 1     |
| `text`        | 0, framed messages on stdout                 | 6, nothing     | 7    | 1     |
| `claude-hook` | 2, framed messages on stderr (wakes Claude)  | 0, nothing     | 0    | 1     |
| `codex-hook`  | 0, `{"decision": "block", "reason"}` stdout  | 0, nothing     | 0    | 1     |

The hook formats read the JSON the harness writes on stdin. Codex runs its Stop hook
synchronously; the waiter waits its whole timeout even when ``stop_hook_active`` says this stop
follows a hook's continuation (it only continues for unseen mail, so it cannot loop on itself),
and returns at once in ``codex exec``. Claude Code runs the ``asyncRewake`` hook in
the background: it holds no turn open, and it wakes the session only for unseen mail, which it
marks shown, so it cannot re-trigger itself; it waits whatever ``stop_hook_active`` says. In
a one-shot ``claude -p`` Claude Code runs that hook synchronously, so there it returns at once
(exit 0, nothing shown); in a stream-json session it ends when the session's input ends
(docs/agents.md#claude-code).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from crossintercom.agents.handover.mail import fit_unseen
from crossintercom.agents.lifetime import lifeline
from crossintercom.errors import Code
from crossintercom.inbox import Entry

# claude-socket: a SessionStart hook that starts the messaging-socket child (claude_socket.py).
FORMATS = ("json", "text", "claude-hook", "codex-hook", "claude-socket")
HOOK_FORMATS = ("claude-hook", "codex-hook")
EXIT_MAIL = 0
EXIT_TIMEOUT = 6
EXIT_BUSY = 7
EXIT_CLAUDE_WAKE = 2
# The harness writes its JSON at once; an open but silent stdin must not hold the hook.
STDIN_WAIT_S = 2.0


def read_hook_input(stream: IO[str] | None, wait_s: float = STDIN_WAIT_S) -> dict[str, Any]:
    """The JSON object a harness sends a hook on stdin; {} when there is none or it is bad.

    Read as it comes, and stopped as soon as it parses: a harness that writes its JSON but
    keeps stdin open must not hold the hook, and neither must a silent stdin (``wait_s``).
    """
    if stream is None or stream.closed:
        return {}
    try:
        if stream.isatty():
            return {}
        fd = stream.fileno()
    except (OSError, ValueError):
        return {}
    buf = b""
    deadline = time.monotonic() + wait_s
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            ready, _, _ = select.select([fd], [], [], remaining)
            chunk = os.read(fd, 65536) if ready else b""
        except OSError:
            break
        if not chunk:
            break  # end of input, or nothing came in time
        buf += chunk
        with contextlib.suppress(ValueError, RecursionError):
            data = json.loads(buf)
            return data if isinstance(data, dict) else {}
    try:
        data = json.loads(buf or b"{}")
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return {}
    return data if isinstance(data, dict) else {}


def _cmdline(pid: int | None) -> list[str]:
    if pid is None:
        return []
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def claude_one_shot(environ: dict[str, str] | None = None) -> bool:
    """Claude Code runs a one-shot ``claude -p`` (docs/agents.md#claude-code): printing, with
    no streaming input (``--input-format stream-json``, ``--sdk-url``) that could bring another
    turn. There it runs an ``asyncRewake`` hook synchronously and waits for it, so the hook must
    return at once. Claude Code names its pid to hooks (``CLAUDE_PID``); its arguments say."""
    environ = dict(os.environ) if environ is None else environ
    named = lifeline.parse_pid(environ.get("CLAUDE_PID", ""))
    cmdline = _cmdline(named or lifeline.find_harness(environ))
    # An ancestor found by walking up is Claude Code only if its command says so (a test
    # runner's own "-p" is not a print flag).
    if named is None and not any("claude" in a.lower() for a in cmdline[:2]):
        return False
    args = cmdline[1:]
    if not any(a in ("-p", "--print") for a in args):
        return False
    streaming = any(
        a == "--input-format=stream-json"
        or a.startswith("--sdk-url")
        or (a == "--input-format" and nxt == "stream-json")
        for a, nxt in zip(args, [*args[1:], ""], strict=True)
    )
    return not streaming


# Codex options that take a value, before its subcommand.
_CODEX_VALUE_OPTS = frozenset({"-c", "--config", "-m", "--model", "-p", "--profile", "-C", "--cd"})


def codex_one_shot(environ: dict[str, str] | None = None) -> bool:
    """Codex runs ``codex exec`` (docs/agents.md#codex): it waits for its Stop hook, and no
    one is there to read a continuation, so the hook must return at once. The hook's input
    says nothing of it; the harness's own arguments do (its subcommand)."""
    argv = _cmdline(lifeline.find_harness(environ))
    if not argv or not Path(argv[0]).name.startswith("codex"):
        return False
    skip = False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in _CODEX_VALUE_OPTS
        else:
            return arg in ("exec", "e")
    return False


def one_shot_harness(fmt: str, environ: dict[str, str] | None = None) -> bool:
    """The hook runs for a one-shot harness run, which would wait for it: return at once."""
    if fmt == "claude-hook":
        return claude_one_shot(environ)
    if fmt == "codex-hook":
        return codex_one_shot(environ)
    return False


def effective_timeout(fmt: str, hook_input: dict[str, Any], timeout: float) -> float:
    """The whole timeout, whatever ``stop_hook_active`` says: a hook only continues a session
    for unseen mail, which it marks shown, so it cannot loop on itself, and a session woken
    once keeps listening for the next message (docs/agents.md#wait)."""
    del fmt, hook_input
    return timeout


def writer(fmt: str, as_name: str) -> Callable[[list[Entry]], list[Entry]]:
    """Writes a hand-over in ``fmt`` and flushes it; returns what it showed, which the caller
    marks shown afterwards. The formats a model reads hold what fits one hand-over's budget
    (docs/agents.md#one-hand-over), the rest staying unseen for the next wake; ``json`` is for
    programs and holds every message whole."""

    def write(entries: list[Entry]) -> list[Entry]:
        if fmt == "json":
            sys.stdout.write(json.dumps([e.body for e in entries], ensure_ascii=False) + "\n")
            sys.stdout.flush()
            return entries
        text, shown = hand_over(fmt, entries, as_name)
        out = sys.stderr if fmt == "claude-hook" else sys.stdout
        out.write(text + "\n")
        out.flush()
        return shown

    return write


def hand_over(fmt: str, entries: list[Entry], as_name: str) -> tuple[str, list[Entry]]:
    """One hand-over of unseen mail in a format a model reads (``text``, ``claude-hook``,
    ``codex-hook``: the JSON Codex's Stop hook answers with) and the entries it shows."""
    mail, shown = fit_unseen(entries, as_name)
    if fmt == "codex-hook":
        return json.dumps({"decision": "block", "reason": mail}), shown
    return mail, shown


def exit_code(fmt: str, got_mail: bool) -> int:
    if got_mail:
        return EXIT_CLAUDE_WAKE if fmt == "claude-hook" else EXIT_MAIL
    if fmt in HOOK_FORMATS:
        return 0  # nothing came: let the session stop (or stay idle) quietly
    if fmt == "json":
        sys.stdout.write("[]\n")
        sys.stdout.flush()
    return EXIT_TIMEOUT


def busy_exit(fmt: str, message: str, as_json: bool) -> int:
    """A second waiter: a clear error for scripts; for hooks, stand aside without noise."""
    if fmt == "codex-hook":
        sys.stdout.write(json.dumps({"systemMessage": f"crossintercom: {message}"}) + "\n")
        return 0
    if fmt == "claude-hook":
        sys.stderr.write(f"crossintercom: {message}\n")
        return 0
    if as_json or fmt == "json":
        sys.stdout.write(
            json.dumps(
                {
                    "error": {
                        "code": Code.WAITER_BUSY,
                        "message": message,
                        "outcome": None,
                        "id": None,
                    }
                }
            )
            + "\n"
        )
    else:
        sys.stderr.write(f"error: {message}\n")
    return EXIT_BUSY
