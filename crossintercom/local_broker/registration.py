"""Registration: which session a connection speaks for, checked against the protocol version,
its purpose and mode, and whether that session is already live elsewhere. An owner is
remembered by the registry before it goes live, then handed its backlog.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from crossintercom import protocol as p
from crossintercom.errors import Code, ProtocolError
from crossintercom.local_broker.delivery.local import Delivery
from crossintercom.local_broker.delivery.relay_link import RelayLink
from crossintercom.local_broker.sessions.conn import Conn
from crossintercom.local_broker.sessions.registry import Live, Registry
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.models import PURPOSES, SessionInfo
from crossintercom.safetext import is_one_line


@dataclass(slots=True)
class Registration:
    host: str
    registry: Registry
    state: BrokerState
    delivery: Delivery
    relay: RelayLink

    def register(self, conn: Conn, f: p.Register) -> None:
        """Check the frame, then attach the connection: the relay's control session, a second
        connection to a live session (``auto``), or the session's owner; then its backlog."""
        s = f.session
        if f.protocol != p.PROTOCOL_VERSION:
            raise ProtocolError(
                f"protocol version {f.protocol} is not supported; this broker speaks "
                f"{p.PROTOCOL_VERSION}. Upgrade the older side",
                code=Code.PROTOCOL_MISMATCH,
            )
        if conn.session_id is not None:
            raise ProtocolError(
                "this connection is already registered", code=Code.ALREADY_REGISTERED
            )
        if s.purpose not in PURPOSES:
            raise ProtocolError(
                f"purpose must be one of {', '.join(PURPOSES)}, got {s.purpose!r}",
                code=Code.INVALID_PURPOSE,
            )
        if f.mode not in ("own", "auto"):
            raise ProtocolError("mode must be 'own' or 'auto'", code=Code.BAD_FIELD)
        if s.purpose == "control":
            self.relay.attach(conn, s.status)
            conn.session_id = s.id
            conn.write(p.Registered(f.request_id, attached=False))
            return
        if s.status is not None and not is_one_line(s.status):  # docs/agents.md#framing
            raise ProtocolError("a status must be one line", code=Code.NOT_ONE_LINE)
        live = self.registry.live.get(s.id)
        attached = False
        if live is not None and live.owner is not None:
            if f.mode == "own":
                raise ProtocolError(
                    f"session {live.info.display_name} ({s.id}) is already live on another "
                    "connection",
                    code=Code.SESSION_IN_USE,
                )
            attached = True
            live.attached.add(conn)
        else:
            info = SessionInfo(
                id=s.id,
                host=self.host,
                name=s.name,
                cwd=s.cwd,
                model=s.model,
                status=s.status,
                purpose="agent",
                groups=self.registry.initial_groups(s.id, s.groups, s.durable),
                durable=s.durable,
                wake=self.registry.initial_wake(s.id, s.durable),
            )
            # Remembered before it goes live: a write that fails (a full disk) must not leave
            # a session in the registry that no connection will ever retire.
            try:
                self.registry.remember(info)
            except sqlite3.Error as exc:
                raise ProtocolError(
                    f"this host's broker cannot write its files ({exc}); try again once "
                    "the disk is writable",
                    code=Code.LOCAL_STORAGE,
                ) from None
            if live is None:
                live = self.registry.live[s.id] = Live(info, conn)
            else:
                live.owner, live.info = conn, info
                self.registry.changed()
            conn.owner = True
        conn.session_id = s.id
        for ask_id in f.awaiting:
            if self.state.ask_owner(ask_id) == s.id:
                self.delivery.ask_waiters[ask_id] = conn
        conn.write(p.Registered(f.request_id, attached=attached, session=live.info))
        if conn.owner:
            self.delivery.drain_backlog(conn, s.id)
            self.relay.send_local_roster()
