"""Target resolution: pure rules over a snapshot of sessions (docs/architecture.md).

A full session id; ``NAME@HOSTID``; a bare ``NAME`` (this host first, live before offline,
then other hosts; refused as ambiguous with candidates at the first level that matches); or
``group:NAME`` (every member but the sender). Nothing here waits or writes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from crossintercom.errors import Code
from crossintercom.local_broker.delivery.outcomes import Refusal
from crossintercom.models import Outcome, SessionInfo, fallback_alias

UUID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
GROUP_PREFIX = "group:"


@dataclass(frozen=True, slots=True)
class Target:
    session_id: str
    host: str
    name: str | None
    local: bool


def is_group(target: str) -> bool:
    return target.startswith(GROUP_PREFIX)


def resolve(
    target: str,
    sender_id: str,
    *,
    host: str,
    local: Sequence[SessionInfo],
    remote: Sequence[SessionInfo],
    by_id: Mapping[str, SessionInfo] | None = None,
    by_name: Mapping[str, Sequence[SessionInfo]] | None = None,
) -> list[Target]:
    """The sessions ``target`` means, seen from ``host``; raises ``Refusal`` otherwise.

    ``by_id`` and ``by_name`` (the registry's snapshot index of ``local`` and ``remote``, local
    first, in their order) make an id or a name a look-up instead of a scan; the answer is
    the same with or without them.
    """

    def as_target(s: SessionInfo) -> Target:
        return Target(s.id, s.host, s.name, s.host == host)

    def named(name: str) -> Sequence[SessionInfo]:
        """Sessions called ``name``, local first, in order: a look-up with the index."""
        if by_name is not None:
            return by_name.get(name, ())
        return [s for s in (*local, *remote) if s.name == name or fallback_alias(s.id) == name]

    if is_group(target):
        group = target[len(GROUP_PREFIX) :]
        members = [
            as_target(s) for s in (*local, *remote) if group in s.groups and s.id != sender_id
        ]
        if not members:
            raise Refusal(Code.NOT_FOUND, f"group {group!r} has no members")
        return members
    if UUID_RE.match(target):
        if by_id is not None:
            hit = by_id.get(target)
            if hit is not None:
                return [as_target(hit)]
            raise Refusal(Code.NOT_FOUND, f"no session with id {target}")
        for s in (*local, *remote):
            if s.id == target:
                return [as_target(s)]
        raise Refusal(Code.NOT_FOUND, f"no session with id {target}")
    name, _, at_host = target.partition("@")
    if at_host:
        # Local sessions are this host's; the remote ones never are (the registry drops them).
        found = [s for s in named(name) if s.host == at_host]
        if len(found) == 1:
            return [as_target(found[0])]
        if not found:
            raise Refusal(Code.NOT_FOUND, f"no session named {name!r} on host {at_host!r}")
        raise Refusal(
            Code.AMBIGUOUS,
            f"{len(found)} sessions named {name!r} on {at_host!r}; use a session id: "
            + ", ".join(s.id for s in found),
        )
    candidates = named(target)
    # This host first, live before offline, then other hosts.
    levels = [(True, True), (True, False), (False, True), (False, False)]
    for here, online in levels:
        found = [s for s in candidates if (s.host == host) is here and s.online == online]
        if len(found) == 1:
            return [as_target(found[0])]
        if len(found) > 1:
            raise Refusal(
                Code.AMBIGUOUS,
                f"{target!r} matches several sessions; use one of: "
                # NAME@HOSTID alone cannot tell two same-host sessions apart: add the id.
                + ", ".join(f"{s.name}@{s.host} (id {s.id})" for s in found),
            )
    raise Refusal(Code.NOT_FOUND, f"no session named {target!r}")


def without_relay(target: str, refusal: Refusal, *, host: str, has_store: bool) -> Refusal:
    """Not found here and no relay to ask: other hosts could not be searched.

    A target on another host, or any target on a host configured for a shared store, is
    `not_sent` (safe to resend once the relay runs); with no store it is simply not found.
    """
    _, _, at_host = target.partition("@")
    if (at_host and at_host != host) or has_store:
        return Refusal(
            Code.NO_RELAY,
            f"{target!r} is not on this host and no relay is connected to reach other "
            "hosts; nothing was sent",
            outcome=Outcome.NOT_SENT,
        )
    return refusal
