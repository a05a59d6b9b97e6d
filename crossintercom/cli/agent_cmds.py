"""wait, mcp, set-status, set-wake, forget: the commands agents' harnesses run (docs/agents.md)."""

from __future__ import annotations

import asyncio
import sys

import click

from crossintercom.agents.answered import check_one_line
from crossintercom.agents.session import Busy
from crossintercom.agents.wake.hooks import (
    FORMATS,
    HOOK_FORMATS,
    busy_exit,
    effective_timeout,
    exit_code,
    one_shot_harness,
    read_hook_input,
    writer,
)
from crossintercom.cli.common import (
    FiniteRange,
    as_options,
    identity,
    json_option,
    one_shot,
    profile_option,
    settings,
)
from crossintercom.cli.output import emit_json, refused_exit
from crossintercom.client import Client, Identity, forget, set_wake
from crossintercom.errors import Code, RemoteError, UsageError
from crossintercom.inbox import Inbox
from crossintercom.models import DESCRIPTION_CHARS, WAKE_POLICIES
from crossintercom.runtime import ensure_runtime_dir

DEFAULT_WAIT_S = 600.0
MAX_WAIT_S = 86400.0


@click.command()
@as_options(required=True)
@click.option(
    "--timeout",
    type=FiniteRange(0, MAX_WAIT_S),
    default=DEFAULT_WAIT_S,
    show_default=True,
    metavar="S",
    help="Seconds to wait for mail (0: only look at what is already there).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="text (default): framed messages on stdout; json: a JSON array; claude-hook: exit 2 "
    "with the messages on stderr (Claude Code asyncRewake Stop hook); codex-hook: "
    '{"decision": "block", "reason": ...} on stdout (Codex Stop hook); claude-socket: '
    "Claude Code SessionStart hook that delivers through the session's messaging socket.",
)
@click.option(
    "--settle",
    type=FiniteRange(0, 3),
    default=0.3,
    show_default=True,
    metavar="S",
    help="Quiet window after the first message, so a burst is handed over as one.",
)
@click.option(
    "--replace",
    is_flag=True,
    help="Ask a waiter already waiting for NAME to step aside (implied by the hook formats).",
)
@json_option
def wait(
    as_name: str,
    session_id: str | None,
    timeout: float,
    fmt: str | None,
    settle: float,
    replace: bool,
    as_json: bool,
) -> None:
    """Wait until NAME has unseen mail, print it once, and exit (see the exit codes in
    docs/agents.md: text/json 0 mail, 6 timeout, 7 another waiter; claude-hook 2 mail)."""
    from crossintercom.agents.lifetime import lifeline
    from crossintercom.agents.lifetime.codex_daemon import tie_to_tui
    from crossintercom.agents.wake.waiter import wait_for_mail

    fmt = fmt or ("json" if as_json else "text")
    if fmt == "claude-socket":
        _claude_socket(as_name, session_id, settle)
    # A Claude Code session that reads a stream ends when its input ends: so does its hook.
    line = lifeline.install(watch_input=fmt == "claude-hook", hook=fmt in HOOK_FORMATS)
    if fmt == "json":
        click.get_current_context().find_root().obj["json"] = True  # errors as JSON too
    hook_input = read_hook_input(sys.stdin) if fmt in HOOK_FORMATS else {}
    if line is not None:
        # A session in Codex's daemon outlives its TUI: so would this hook (docs/agents.md#codex).
        cwd = hook_input.get("cwd")
        tie_to_tui(line.harness, cwd if isinstance(cwd, str) else None, lifeline.terminate)
    if one_shot_harness(fmt):
        sys.exit(0)  # `claude -p`, `codex exec` would wait for this hook: mail stays unseen
    cfg = settings()
    ident = Identity.named(cfg, as_name, session_id)
    try:
        got = asyncio.run(
            wait_for_mail(
                cfg,
                ident,
                writer(fmt, as_name),
                timeout=effective_timeout(fmt, hook_input, timeout),
                quiet=settle,
                replace=replace or fmt in HOOK_FORMATS,
            )
        )
    except Busy as exc:
        sys.exit(busy_exit(fmt, exc.message, as_json))
    sys.exit(exit_code(fmt, bool(got)))


def _claude_socket(as_name: str, session_id: str | None, settle: float) -> None:
    """The SessionStart hook starts the delivery child and returns at once; the child delivers
    until Claude Code ends or the socket refuses (docs/agents.md#claude-code)."""
    import os

    from crossintercom.agents.lifetime import lifeline
    from crossintercom.agents.wake import claude_socket

    environ = dict(os.environ)
    if not environ.get(claude_socket.ENV_CHILD):
        claude_socket.start_child(environ)
        sys.exit(0)
    lifeline.install(detached=True)
    found = claude_socket.target(environ)
    if found is None:
        sys.exit(0)
    cfg = settings()
    ident = Identity.named(cfg, as_name, session_id)
    asyncio.run(claude_socket.deliver_all(cfg, ident, *found, quiet=settle))
    sys.exit(0)


@click.command()
@as_options(required=True)
@click.option(
    "--supervisor",
    metavar="TARGET",
    help="Where escalations go (NAME, NAME@HOSTID or a session id).",
)
@profile_option
@click.option(
    "--print-tools",
    is_flag=True,
    help="Print the profile's tools/list JSON (what a model reads on every turn) and exit.",
)
def mcp(
    as_name: str,
    session_id: str | None,
    supervisor: str | None,
    profile: str | None,
    print_tools: bool,
) -> None:
    """Serve NAME's mailbox as MCP tools on stdio, holding NAME's session while it runs."""
    try:
        from crossintercom.agents.mcp.server import serve
    except ImportError as exc:
        raise UsageError(
            f"the MCP server needs the mcp extra: pip install 'crossintercom[mcp]' ({exc})"
        ) from None
    from crossintercom.agents.lifetime import lifeline
    from crossintercom.agents.lifetime.codex_daemon import tie_to_tui

    if print_tools:
        from crossintercom.agents.mcp.server import tools_list

        cfg = settings()
        ident = Identity.named(cfg, as_name, session_id)
        click.echo(asyncio.run(tools_list(cfg, ident, profile)))
        return
    if (line := lifeline.install()) is not None:
        # Under Codex's daemon the server would outlive the TUI (docs/agents.md#codex).
        tie_to_tui(line.harness, None, lifeline.terminate)
    cfg = settings()
    asyncio.run(serve(cfg, Identity.named(cfg, as_name, session_id), supervisor, profile))


@click.command("set-status")
@as_options(required=True)
@click.option("--clear", is_flag=True, help="Remove the status.")
@json_option
@click.argument("text", required=False)
def set_status(
    as_name: str, session_id: str | None, clear: bool, as_json: bool, text: str | None
) -> None:
    """Set the status text others see in `list` for NAME's live session on this host."""
    if clear == (text is not None):
        raise click.UsageError("give TEXT, or --clear")
    if text is not None and not text.strip():
        raise click.UsageError("the status is empty; use --clear to remove it")
    check_one_line("status", text)
    if text is not None and len(text) > DESCRIPTION_CHARS:
        raise click.UsageError(f"the status is over {DESCRIPTION_CHARS} characters")
    cfg = settings()
    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        attached = client.aio.attached
        if attached:
            client.set_status(None if clear else text)
    if not attached:
        refused_exit(
            Code.NOT_ONLINE,
            f"{as_name} is not online on this host; a status belongs to a live session (the "
            "MCP server, `listen` or `wait` holding it), so nothing was changed",
            as_json,
        )
    if as_json:
        emit_json({"name": as_name, "status": None if clear else text})
    else:
        click.echo(f"{as_name}: status {'cleared' if clear else repr(text)}")


@click.command("set-wake")
@as_options(required=True)
@json_option
@click.argument("policy", type=click.Choice(WAKE_POLICIES))
def set_wake_cmd(as_name: str, session_id: str | None, as_json: bool, policy: str) -> None:
    """Set which mail wakes NAME's waiting surfaces (wait, hooks, the line monitor): every
    message, only asks, or never. Kept with NAME's durable session."""
    cfg = settings()
    wake = next(w for w in WAKE_POLICIES if w == policy)
    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        info = client.run(lambda c: set_wake(c, wake))
    if as_json:
        emit_json({"name": as_name, "wake": info.wake})
    else:
        click.echo(f"{as_name}: wake policy {info.wake}")


@click.command("forget")
@click.option("--session-id", metavar="ID", help="Forget this session id instead of NAME's.")
@json_option
@click.argument("name")
def forget_cmd(session_id: str | None, as_json: bool, name: str) -> None:
    """Forget the durable session NAME on this host: its queued and held mail expires (the
    senders get `expired` receipts), its inbound rules go, asks waiting for its reply are told,
    other hosts stop listing it, and its inbox file is deleted. Refused while NAME is live."""
    cfg = settings()
    ensure_runtime_dir(cfg)
    sid = Identity.named(cfg, name, session_id).id
    try:
        with Client(cfg, None, reconnect=False) as client:
            done = client.run(lambda c: forget(c, sid))
    except RemoteError as exc:
        refused_exit(exc.code, exc.message, as_json)
    removed = Inbox.remove(cfg.inbox_dir, sid)
    out = {
        "name": name,
        "id": sid,
        "expired": done.expired,
        "dropped_asks": done.dropped_asks,
        "inbox_removed": removed,
    }
    if as_json:
        emit_json(out)
    else:
        click.echo(
            f"forgot {name} ({sid}): {done.expired} queued message(s) expired, "
            f"{done.dropped_asks} waiting ask(s) told" + ("; inbox deleted" if removed else "")
        )


COMMANDS = (wait, mcp, set_status, set_wake_cmd, forget_cmd)
