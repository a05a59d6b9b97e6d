"""The session registry: who is live here, who is known (durable), who is on other hosts.

Plain bookkeeping, no I/O but the durable record of known sessions: the broker's rooms read
it to resolve targets, route replies and answer ``list``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from crossintercom.local_broker.state.store import BrokerState, KnownSession
from crossintercom.models import (
    WAKE_POLICIES,
    Peer,
    SessionInfo,
    WakePolicy,
    fallback_alias,
    rightful_claims,
)

if TYPE_CHECKING:
    from crossintercom.local_broker.sessions.conn import Conn

log = logging.getLogger(__name__)


@dataclass
class Live:
    """A session with a connection: its owner (listener) and one-shot commands attached."""

    info: SessionInfo
    owner: Conn | None
    attached: set[Conn] = field(default_factory=set)


K = TypeVar("K")
V = TypeVar("V")


class _Tracked(dict[K, V]):
    """A dict that reports each change, so the registry knows when its snapshot is stale."""

    def __init__(self, changed: Callable[[], None], items: Mapping[K, V] | None = None) -> None:
        super().__init__(items or {})
        self._changed = changed

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key: K) -> None:
        super().__delitem__(key)
        self._changed()

    def pop(self, key: K, *default: Any) -> Any:
        self._changed()
        return super().pop(key, *default)

    def setdefault(self, key: K, default: V) -> V:
        self._changed()
        return super().setdefault(key, default)

    def popitem(self) -> tuple[K, V]:
        self._changed()
        return super().popitem()

    def clear(self) -> None:
        super().clear()
        self._changed()

    def update(self, *args: Any, **kw: Any) -> None:
        super().update(*args, **kw)
        self._changed()


@dataclass(frozen=True)
class Snapshot:
    """Every session as ``resolve`` and ``list`` see them, indexed by id and by name (and
    fallback alias), built once per change instead of once per send: resolving a name is then
    a dict look-up whatever the number of sessions (docs/performance.md)."""

    local: list[SessionInfo]
    remote: list[SessionInfo]
    by_id: dict[str, SessionInfo]
    by_name: dict[str, list[SessionInfo]]

    @classmethod
    def of(cls, local: list[SessionInfo], remote: list[SessionInfo]) -> Snapshot:
        by_id: dict[str, SessionInfo] = {}
        by_name: dict[str, list[SessionInfo]] = {}
        for s in (*local, *remote):
            by_id.setdefault(s.id, s)
            for name in dict.fromkeys((s.name, fallback_alias(s.id))):
                if name is not None:
                    by_name.setdefault(name, []).append(s)
        return cls(local, remote, by_id, by_name)


class Registry:
    def __init__(self, host: str, state: BrokerState) -> None:
        self.host = host
        self.state = state
        self._snapshot: Snapshot | None = None
        self.live: dict[str, Live] = _Tracked(self.changed)
        self.known: dict[str, KnownSession] = _Tracked(self.changed, state.known_sessions())
        self._remote: dict[str, SessionInfo] = _Tracked(self.changed)

    def changed(self) -> None:
        """Any change to who is here or how they are seen: the next snapshot is rebuilt.
        Every change to ``live``, ``known`` and ``remote`` calls it; so must a new ``info``."""
        self._snapshot = None

    @property
    def remote(self) -> dict[str, SessionInfo]:
        return self._remote

    @remote.setter
    def remote(self, sessions: dict[str, SessionInfo]) -> None:
        self._remote = _Tracked(self.changed, sessions)
        self.changed()

    def snapshot(self) -> Snapshot:
        if self._snapshot is None:
            self._snapshot = Snapshot.of(self._local_sessions(), list(self._remote.values()))
        return self._snapshot

    def owner(self, session_id: str) -> Conn | None:
        live = self.live.get(session_id)
        return live.owner if live is not None else None

    def is_durable(self, session_id: str) -> bool:
        return session_id in self.known

    def is_local(self, session_id: str) -> bool:
        return session_id in self.live or session_id in self.known

    def local_sessions(self) -> list[SessionInfo]:
        return list(self.snapshot().local)

    def _local_sessions(self) -> list[SessionInfo]:
        out = [lv.info for lv in self.live.values() if lv.info.purpose == "agent"]
        for sid, known in self.known.items():
            if sid not in self.live:
                out.append(
                    SessionInfo(
                        id=sid,
                        host=self.host,
                        name=known.name,
                        groups=tuple(known.groups),
                        durable=True,
                        online=False,
                        wake=_wake(known.wake),
                    )
                )
        return out

    def remote_sessions(self) -> list[SessionInfo]:
        return list(self.snapshot().remote)

    def all_sessions(self) -> list[SessionInfo]:
        snap = self.snapshot()
        return snap.local + snap.remote

    def initial_groups(
        self, session_id: str, given: list[str] | None, durable: bool
    ) -> tuple[str, ...]:
        """Groups given at registration, else those a durable session had, else 'default'."""
        if given:
            return tuple(given)
        known = self.known.get(session_id)
        if durable and known is not None and known.groups:
            return tuple(known.groups)
        return ("default",)

    def initial_wake(self, session_id: str, durable: bool) -> WakePolicy:
        """A durable session keeps the wake policy it had; any other starts at 'every'."""
        known = self.known.get(session_id)
        return _wake(known.wake) if durable and known is not None else "every"

    def remember(self, info: SessionInfo) -> None:
        """Keep a durable session's name, groups and wake policy across broker restarts."""
        if info.durable:
            known = KnownSession(info.name, list(info.groups), info.wake)
            if self.known.get(info.id) == known:
                return  # already on disk: a re-registration writes nothing (a full disk)
            self.state.remember_session(info.id, info.name, list(info.groups), info.wake)
            self.known[info.id] = known

    def forget(self, session_id: str) -> None:
        self.known.pop(session_id, None)

    def update(self, session_id: str, **changes: object) -> SessionInfo:
        live = self.live[session_id]
        live.info = msgspec.structs.replace(live.info, **changes)
        self.changed()
        self.remember(live.info)
        return live.info

    def detach(self, conn: Conn) -> bool:
        """Forget ``conn``'s part in its session; True if the session's presence changed."""
        sid = conn.session_id
        if sid is None or sid not in self.live:
            return False
        live = self.live[sid]
        live.attached.discard(conn)
        if live.owner is conn:
            live.owner = None
        if live.owner is None and not live.attached:
            del self.live[sid]
        return True

    def set_remote(self, sessions: list[SessionInfo]) -> None:
        # Indexed by id: a claim its host cannot rightly make would reroute mail by id.
        kept, dropped = rightful_claims([s for s in sessions if s.host != self.host])
        if dropped:
            log.warning(
                "remote sessions dropped: claims their hosts cannot rightly make",
                extra={"sessions": sorted(f"{s.id}@{s.host}" for s in dropped)},
            )
        self.remote = {s.id: s for s in kept}

    def sender_online(self, sender: Peer) -> bool:
        if sender.host == self.host:
            return sender.id in self.live
        s = self.remote.get(sender.id)
        return s is not None and s.online


_WAKES: dict[str, WakePolicy] = {w: w for w in WAKE_POLICIES}


def _wake(value: str) -> WakePolicy:
    return _WAKES.get(value, "every")
