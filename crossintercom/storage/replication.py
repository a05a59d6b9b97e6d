"""What an acknowledgement is worth on the store's PostgreSQL server: whether it replicates
synchronously (docs/operations.md, "High availability").

With ``synchronous_standby_names`` naming a standby that is connected and ``synchronous_commit``
at ``on`` (or ``remote_write``/``remote_apply``), a COMMIT returns once a standby has the WAL:
a message acknowledged ``delivered`` or ``queued`` survives the promotion of that standby.
Without it, the last commits before a failover can be lost.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from sqlalchemy.exc import SQLAlchemyError

from crossintercom.storage import engine as db
from crossintercom.storage import queries as q
from crossintercom.storage.urls import parse_store_url

Mode = Literal["synchronous", "waiting", "asynchronous", "none", "unknown", "not postgresql"]
# synchronous_commit levels at which a COMMIT waits for a synchronous standby.
_WAITS = frozenset({"on", "remote_write", "remote_apply"})

_SAYS: dict[str, str] = {
    "synchronous": "synchronous replication: nothing acknowledged is lost if a synchronous "
    "standby is promoted",
    "waiting": "synchronous replication configured but no synchronous standby is connected: "
    "every commit waits until one is",
    "asynchronous": "asynchronous replication: the last acknowledged messages before a "
    "failover can be lost",
    "none": "no standby: acknowledgements are as durable as this one server",
    "unknown": "this role cannot see the standbys' modes (pg_read_all_stats); ask the "
    "database admin",
    "not postgresql": "a SQLite store: no replication",
}


@dataclass(frozen=True, slots=True)
class Replication:
    mode: Mode
    standbys: int = 0
    synchronous_standbys: int = 0
    synchronous_standby_names: str = ""
    synchronous_commit: str = ""
    in_recovery: bool = False

    @property
    def says(self) -> str:
        return _SAYS[self.mode]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"says": self.says}


def classify(
    in_recovery: bool, names: str, commit: str, standbys: int, sync: int, hidden: int
) -> Replication:
    """The mode from what the server says (pure: tested without a server)."""

    def made(mode: Mode) -> Replication:
        return Replication(mode, standbys, sync, names, commit, in_recovery)

    wants_sync = bool(names.strip()) and commit in _WAITS
    if wants_sync and sync:
        return made("synchronous")
    if hidden and wants_sync:
        return made("unknown")
    if wants_sync:
        return made("waiting")
    return made("asynchronous" if standbys else "none")


def replication(url: str) -> Replication:
    """The replication of the store at ``url`` (the server a connection lands on: with a host
    list and target_session_attrs=read-write, the primary). Raises StoreError when it cannot
    be reached."""
    parsed = parse_store_url(url)
    if parsed.kind != "postgres":
        return Replication("not postgresql")
    engine = db.store_engine(parsed, pool_size=1)
    try:
        with engine.connect() as conn:
            row = conn.execute(q.PG_REPLICATION).one()
    except SQLAlchemyError as exc:
        raise db.translate(parsed, exc) from exc
    finally:
        engine.dispose()
    in_recovery, names, commit, standbys, sync, hidden = row
    return classify(
        bool(in_recovery), str(names), str(commit), int(standbys), int(sync), int(hidden)
    )
