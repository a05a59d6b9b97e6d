"""A relay whose SQLite store's filesystem locks do not exclude across hosts
(storage/lockcheck.py): it writes nothing, says why, and answers every send at once.

The beacon is checked before the store is opened (a relay that finds the locks unsafe never
opens it) and every ``lockcheck.BEAT_S`` while the relay runs; a failure mid-run stops the relay
(the driver already refuses every transaction) and this refusing relay takes its place. It stays
connected to the broker, so `status` and the overseer page show the refusal, and each send to
another host is answered ``not_sent`` with ``store_locks_unsafe``; it keeps beating, so the other
relays find the same thing and stop writing too. The other hosts' sessions are read once from
the file without locks (``sqlite.roster_without_locks``) and shown offline, so a send to one is
answered by this relay rather than refused as an unknown target.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import msgspec

from crossintercom import protocol as p
from crossintercom.client import AsyncClient, Identity
from crossintercom.config import Settings
from crossintercom.errors import Code
from crossintercom.models import Outcome, Receipt, SessionInfo, new_id, rightful_claims
from crossintercom.relay.systemd import Notifier
from crossintercom.storage.lockcheck import BEAT_S, LockBeacon
from crossintercom.storage.sqlite import roster_without_locks

log = logging.getLogger(__name__)

# What agents read in the receipt (their models see it: no file names).
NOT_SENT_WHY = (
    "the shared store's filesystem does not keep writers on different hosts apart, so this "
    "host's relay writes nothing to it (`crossintercom status` says what to do); nothing was sent"
)


async def keep_beating(beacon: LockBeacon, on_refusal: Callable[[str], None]) -> None:
    """Until cancelled: the beacon's beat and probe every BEAT_S; ``on_refusal`` once, when
    the locks are found not to exclude."""
    told = False
    while True:
        await asyncio.sleep(BEAT_S)
        why = await asyncio.to_thread(beacon.tick)
        if why is not None and not told:
            told = True
            on_refusal(why)


def _answer(client: AsyncClient, frame: p.ToRelayFrame) -> None:
    if isinstance(frame, p.Forward):
        msg_id = frame.message.id
        receipts = [
            Receipt(msg_id, Outcome.NOT_SENT, r.session, Code.STORE_LOCKS_UNSAFE, NOT_SENT_WHY)
            for r in frame.recipients
        ]
        client.post(p.ForwardResult(frame.fid, receipts))
    elif isinstance(frame, p.RefreshRoster):
        client.post(p.RosterRefreshed(frame.fid))
    elif isinstance(frame, p.ReservationRequest):
        client.post(
            p.ReservationReply(frame.fid, code=Code.STORE_LOCKS_UNSAFE, message=NOT_SENT_WHY)
        )


def others_offline(path: Path, host: str) -> list[SessionInfo]:
    """The other hosts' agent sessions the file names, each shown offline (nothing here can
    tell whether they are alive)."""
    kept, _dropped = rightful_claims(roster_without_locks(path))
    return [
        msgspec.structs.replace(s, online=False)
        for s in kept
        if s.host != host and s.purpose == "agent"
    ]


async def refuse(
    settings: Settings,
    masked_url: str,
    why: str,
    beacon: LockBeacon,
    stopping: asyncio.Event,
    notifier: Notifier,
) -> None:
    """Serve the broker as a relay that writes nothing, until ``stopping`` is set. Ready for
    systemd once connected, the refusal its status: a unit that restarted it would only find
    the same."""
    ident = Identity(id=new_id(), name="relay", purpose="control", status=f"{masked_url}: {why}")
    client = AsyncClient(settings, ident, mode="own", spawn=True, reconnect=True)
    client.on_frame = lambda frame: _answer(client, frame)
    beat = asyncio.get_running_loop().create_task(keep_beating(beacon, lambda _why: None))
    try:
        remote = await asyncio.to_thread(others_offline, beacon.db_path, settings.host_id)
        await client.connect()
        client.post(p.RemoteRoster(remote))
        notifier.ready(why)
        await stopping.wait()
    finally:
        beat.cancel()
        await client.close()
