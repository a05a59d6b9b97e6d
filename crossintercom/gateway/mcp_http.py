"""The gateway's MCP over streamable HTTP (``gateway serve --mcp`` or ``--mcp-listen``): for a
harness that takes a remote MCP server by URL, with nothing of crossintercom installed beside
it (docs/agents.md#mcp-over-http).

Each request to ``/mcp`` carries ``Authorization: Bearer TOKEN``; the grant names the session.
The gateway holds that session here, on its own host (``AgentSession``, its inbox in this host's
runtime dir, as ``crossintercom mcp`` would), and answers with the same MCP server and profile as
on stdio: shown-once, framing and the hand-over budget unchanged. A request without a live
grant is refused with the gateway's codes before the MCP layer sees it; a grant revoked or
expired ends its session within ``RECHECK_S``. Plain HTTP is served to loopback clients only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from mcp.server.transport_security import TransportSecuritySettings

from crossintercom.agents.mcp.server import MailboxServer, build_server
from crossintercom.agents.session import AgentSession
from crossintercom.agents.wake.hooks import hand_over
from crossintercom.agents.wake.waiter import wait_on
from crossintercom.client import Identity
from crossintercom.client.gateway_link import is_loopback
from crossintercom.config import Settings
from crossintercom.errors import Code, CrossintercomError, RemoteError
from crossintercom.gateway.refusals import deny
from crossintercom.gateway.tokens import Grant, Grants
from crossintercom.inbox import Entry

log = logging.getLogger(__name__)

PATH = "/mcp"
WAIT_PATH = "/wait"
# A hook confirms here that its harness read what a poll handed it (docs/agents.md#mcp-over-http).
SHOWN_PATH = "/wait/shown"
# Hand-overs awaiting their confirmation, per session: older ones are forgotten (their mail
# stays unseen, handed again by the next poll).
MAX_HANDED = 64
WAIT_FORMATS = ("text", "claude-hook", "codex-hook")
# A wake hook's long poll lasts at most this long (Claude Code's hook runs an hour).
MAX_WAIT_S = 3600.0
RECHECK_S = 2.0
Scope = dict[str, Any]


@dataclass
class _Held:
    grant: Grant
    session: AgentSession
    server: MailboxServer
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # Set when the grant ends: a long poll under way returns with nothing shown.
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    # Confirmation key -> the inbox seqs a poll handed over, not marked shown until confirmed.
    handed: OrderedDict[str, frozenset[int]] = field(default_factory=OrderedDict)


class McpGateway:
    """An ASGI app: the token's session's MCP server, one per grant."""

    def __init__(self, settings: Settings, tls: bool, profile: str | None) -> None:
        self.settings = settings
        self.tls = tls
        self.profile = profile
        self.grants = Grants(settings)
        self.held: dict[str, _Held] = {}
        self._lock = asyncio.Lock()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        client = scope.get("client") or ("", 0)
        if not self.tls and not is_loopback(str(client[0])):
            return await deny(send, 403, Code.GATEWAY_PLAIN_HTTP, "plain HTTP: loopback only")
        path = scope["path"].rstrip("/")
        if path not in (PATH, WAIT_PATH, SHOWN_PATH):
            return await deny(send, 404, Code.NOT_FOUND, f"this gateway serves MCP at {PATH}")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        kind, _, token = headers.get("authorization", "").partition(" ")
        try:
            grant = self.grants.check(token.strip() if kind.lower() == "bearer" else None)
        except RemoteError as exc:
            log.info("MCP request from %s refused: %s", client[0], exc.code)
            return await deny(send, 401, exc.code, exc.message)
        except CrossintercomError as exc:
            log.error("grants file: %s", exc.message)
            return await deny(send, 503, Code.INTERNAL, "the gateway cannot read its grants")
        held = await self._hold(grant)
        if path == WAIT_PATH:
            return await self._wait(held, scope, receive, send)
        if path == SHOWN_PATH:
            return await _confirm(held, scope, send)
        await held.server.session_manager.handle_request(scope, receive, send)

    async def _wait(self, held: _Held, scope: Scope, receive: Any, send: Any) -> None:
        """``GET /wait?format=F&timeout=S``: a wake hook's long poll (``curl``). Returns 200
        once mail the session's wake policy wakes for is unseen: a confirmation key on the
        first line, then the hand-over; or 204 after ``timeout`` seconds. Nothing is marked
        shown here: only ``POST /wait/shown?key=KEY`` does, sent by a hook that checked its
        harness is still there to read it (a curl outliving its harness must not lose mail)."""
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        fmt = query.get("format", ["text"])[0]
        if fmt not in WAIT_FORMATS:
            return await deny(send, 400, Code.INVALID_ARGUMENT, f"format: one of {WAIT_FORMATS}")
        try:
            timeout = min(max(float(query.get("timeout", ["600"])[0]), 0.0), MAX_WAIT_S)
        except ValueError:
            return await deny(send, 400, Code.INVALID_ARGUMENT, "timeout: seconds")
        said: list[str] = []
        handed: list[Entry] = []

        def write(entries: list[Entry]) -> list[Entry]:
            text, shown = hand_over(fmt, entries, held.grant.name)
            said.append(text)
            handed.extend(shown)
            return []  # marked once the hook confirms

        # Nothing is shown to a poll that is gone: its client hung up, or the grant ended.
        stop = asyncio.Event()
        watchers = [
            asyncio.create_task(_until_gone(receive, stop)),
            asyncio.create_task(_relay(held.stop, stop)),
        ]
        try:
            await wait_on(held.session, write, timeout=timeout, stop=stop)
        finally:
            for task in watchers:
                task.cancel()
        if stop.is_set() and not handed:
            return
        if not handed:
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        key = secrets.token_urlsafe(16)
        held.handed[key] = frozenset(e.seq for e in handed)
        while len(held.handed) > MAX_HANDED:
            held.handed.popitem(last=False)
        body = f"{key}\n{said[0]}\n".encode()
        kind = b"application/json" if fmt == "codex-hook" else b"text/plain; charset=utf-8"
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]}
        )
        await send({"type": "http.response.body", "body": body})

    async def _hold(self, grant: Grant) -> _Held:
        async with self._lock:
            held = self.held.get(grant.id)
            if held is not None:
                return held
            identity = Identity.named(self.settings, grant.name, cwd=None)
            session = await AgentSession(self.settings, identity).start()
            server = build_server(session, None, self.profile)
            # The token is the boundary: a remote harness names this host as it reaches it.
            server.streamable_http_app(
                transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False)
            )
            held = _Held(grant, session, server)
            running = asyncio.Event()
            held.tasks.append(asyncio.create_task(_run(server, running)))
            held.tasks.append(asyncio.create_task(self._watch(held)))
            await running.wait()
            self.held[grant.id] = held
            log.info("MCP session %s held for grant %s", grant.name, grant.id)
            return held

    async def _watch(self, held: _Held) -> None:
        while True:
            await asyncio.sleep(RECHECK_S)
            try:
                await asyncio.to_thread(self.grants.recheck, held.grant.id)
            except RemoteError as exc:
                log.info("grant %s ended (%s): its MCP session closes", held.grant.id, exc.code)
                break
        async with self._lock:
            self.held.pop(held.grant.id, None)
        await _close(held, skip=asyncio.current_task())

    async def close(self) -> None:
        for held in list(self.held.values()):
            await _close(held)
        self.held.clear()


async def _confirm(held: _Held, scope: Scope, send: Any) -> None:
    """``POST /wait/shown?key=KEY``: mark shown what the poll that answered KEY handed over
    (what is still unseen of it: the ``inbox`` tool may have shown some meanwhile); 204."""
    if scope["method"] != "POST":
        return await deny(send, 405, Code.INVALID_ARGUMENT, f"POST {SHOWN_PATH}?key=KEY")
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    seqs = held.handed.pop(query.get("key", [""])[0], None)
    if seqs is None:
        # Unknown or already used (or the gateway restarted since): its mail stays unseen.
        return await deny(send, 404, Code.NOT_FOUND, "no hand-over awaits this key")
    try:
        held.session.show(lambda entries: [e for e in entries if e.seq in seqs])
    except CrossintercomError as exc:
        held.handed[query["key"][0]] = seqs  # not marked: the hook may confirm again
        return await deny(send, 503, exc.code, exc.message)
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def _until_gone(receive: Any, stop: asyncio.Event) -> None:
    """Set ``stop`` once the client disconnects (ASGI's ``http.disconnect``)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    stop.set()


async def _relay(source: asyncio.Event, stop: asyncio.Event) -> None:
    await source.wait()
    stop.set()


async def _run(server: MailboxServer, running: asyncio.Event) -> None:
    async with server.session_manager.run():
        running.set()
        await asyncio.Future()


async def _close(held: _Held, skip: asyncio.Task[Any] | None = None) -> None:
    held.stop.set()
    for task in held.tasks:
        if task is not skip:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    await held.session.close()
