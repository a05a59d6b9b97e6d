"""Inbound policy: per session, rules by sender that accept, hold or refuse its mail
(docs/agents.md#inbound-policy). Kept in ``broker.sqlite`` (durable across restarts) and
applied where every message for a local session passes (``Delivery.deliver``), whichever host
sent it; the one answer to an open ask of the session (``Delivery.route_reply``) is never held
or refused.

A rule's pattern is ``NAME@HOST``, ``NAME``, ``*@HOST``, ``group:NAME`` or ``*``; the most
specific matching rule wins, in that order, and no rule means accept. HOST is any valid host id
(``config.valid_host_id``: the default ``USER@HOSTNAME`` too), split off at the first ``@``,
which no name holds. A group is whatever its members say they are in (anyone may join one), so a
group rule may hold or refuse but never accept: an allowlist of a group would admit anyone.
Held mail is saved here, not pushed, shown or woken for, and its sender is told ``queued``;
unheld (the frame's ``release`` field, the ``release`` command), it is queued for the session
like mail that waited while it was away.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from crossintercom.codes import Code
from crossintercom.config import valid_host_id
from crossintercom.local_broker.sessions.registry import Registry
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.models import REFUSAL_ADVICE, Message, Outcome, Peer, Receipt, valid_name

Action = Literal["accept", "hold", "refuse"]
ACTIONS: tuple[Action, ...] = ("accept", "hold", "refuse")


def valid_pattern(pattern: str) -> bool:
    if pattern == "*":
        return True
    if pattern.startswith("group:"):
        return valid_name(pattern[6:])
    name, _, host = pattern.partition("@")
    if not _:
        return valid_name(name)
    return (name == "*" or valid_name(name)) and valid_host_id(host)


def is_group(pattern: str) -> bool:
    return pattern.startswith("group:")


def _candidates(sender: Peer, groups: tuple[str, ...]) -> list[str]:
    """The patterns that match ``sender``, most specific first."""
    out = []
    if sender.name:
        out += [f"{sender.name}@{sender.host}", sender.name]
    out += [f"{sender.id}@{sender.host}", sender.id, f"*@{sender.host}"]
    out += [f"group:{g}" for g in groups]
    return [*out, "*"]


class InboundPolicy:
    def __init__(self, state: BrokerState, registry: Registry) -> None:
        self.db = state.db
        self.registry = registry
        # Each session's rules as last read: every message handed over asks for them, and
        # only ``set`` changes them (docs/perf-log/2026-12.md, "The hand-over's Python per
        # message").
        self._rules: dict[str, dict[str, str]] = {}

    def screen(self, msg: Message, recipient: str) -> Receipt | None:
        """``Delivery.screen``: None to deliver, else the receipt of a hold or a refusal."""
        sender = self.registry.remote.get(msg.sender.id) or self.registry.live.get(msg.sender.id)
        info = getattr(sender, "info", sender)
        groups = tuple(getattr(info, "groups", ()))
        verdict = self.verdict(recipient, msg.sender, groups)
        if verdict == "refuse":
            return Receipt(
                msg.id,
                Outcome.REFUSED,
                recipient,
                Code.SENDER_REFUSED,
                REFUSAL_ADVICE[Code.SENDER_REFUSED],
            )
        if verdict == "hold":
            self.hold(recipient, msg)
            return Receipt(msg.id, Outcome.QUEUED, recipient)
        return None

    def set(self, session: str, pattern: str, action: Action | None) -> None:
        self._rules.pop(session, None)
        try:
            self._write(session, pattern, action)
        finally:
            self._rules.pop(session, None)

    def _write(self, session: str, pattern: str, action: Action | None) -> None:
        if action is None:
            self.db.execute(
                "DELETE FROM inbound_rules WHERE session = ? AND pattern = ?", (session, pattern)
            )
        else:
            self.db.execute(
                "INSERT OR REPLACE INTO inbound_rules (session, pattern, action) VALUES (?, ?, ?)",
                (session, pattern, action),
            )

    def rules(self, session: str) -> dict[str, str]:
        cached = self._rules.get(session)
        if cached is None:
            cur = self.db.execute(
                "SELECT pattern, action FROM inbound_rules WHERE session = ? ORDER BY pattern",
                (session,),
            )
            cached = self._rules[session] = dict(cur.fetchall())
        return dict(cached)

    def verdict(self, session: str, sender: Peer, groups: tuple[str, ...]) -> str:
        rules = self.rules(session)
        if not rules:
            return "accept"
        # A group's accept (one kept from before such rules were refused) is passed over: the
        # sender's own claim to be in a group lets nobody past a broader hold or refuse.
        return next(
            (
                rules[c]
                for c in _candidates(sender, groups)
                if c in rules and not (is_group(c) and rules[c] == "accept")
            ),
            "accept",
        )

    def held_count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM held_mail").fetchone()[0])

    def summary(self) -> dict[str, dict[str, Any]]:
        """For ``status``: each session with rules or held mail, by its name."""
        out: dict[str, dict[str, Any]] = {}

        def entry(sid: str) -> dict[str, Any]:
            known = self.registry.known.get(sid)
            name = known.name if known is not None and known.name else sid
            return out.setdefault(name, {"rules": {}, "held": 0})

        for sid, pattern, action in self.db.execute(
            "SELECT session, pattern, action FROM inbound_rules ORDER BY pattern"
        ):
            entry(sid)["rules"][pattern] = action
        for sid, n in self.db.execute("SELECT session, count(*) FROM held_mail GROUP BY session"):
            entry(sid)["held"] = n
        return out

    def hold(self, session: str, msg: Message) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO held_mail (session, message_id, body, held) VALUES (?, ?, ?, ?)",
            (session, msg.id, json.dumps(msg.to_dict()), time.time()),
        )

    def held(self, session: str) -> list[tuple[str, dict[str, object], float]]:
        cur = self.db.execute(
            "SELECT message_id, body, held FROM held_mail WHERE session = ? ORDER BY seq",
            (session,),
        )
        return [(mid, json.loads(body), at) for mid, body, at in cur]

    def forget(self, session: str) -> list[Message]:
        """A name that is forgotten or retired: its rules go, and its held mail is returned
        (removed) for its senders to be told; the next session of that name starts clean."""
        self._rules.pop(session, None)
        held = self.take(session, None)
        self.db.execute("DELETE FROM inbound_rules WHERE session = ?", (session,))
        return held

    def take_expired(
        self, retention_s: float, now: float | None = None
    ) -> list[tuple[str, Message]]:
        """Held mail older than the retention (as queued mail expires), removed, with the
        session it was held for: its senders are told ``expired``."""
        cutoff = (time.time() if now is None else now) - retention_s
        rows = self.db.execute(
            "SELECT seq, session, body FROM held_mail WHERE held <= ? ORDER BY seq", (cutoff,)
        ).fetchall()
        self.db.executemany("DELETE FROM held_mail WHERE seq = ?", [(r[0],) for r in rows])
        return [(sid, Message.from_dict(json.loads(body))) for _, sid, body in rows]

    def take(self, session: str, ids: list[str] | None) -> list[Message]:
        """Held messages to let out (``None``: all of them), removed from the hold."""
        found = [(mid, body) for mid, body, _ in self.held(session) if ids is None or mid in ids]
        self.db.executemany(
            "DELETE FROM held_mail WHERE session = ? AND message_id = ?",
            [(session, mid) for mid, _ in found],
        )
        return [Message.from_dict(body) for _, body in found]
