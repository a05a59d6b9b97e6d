"""A compromised host tries to make other hosts' mail vanish as its own role (PostgreSQL,
per-host roles as docs/operations.md sets them up): the recipient's host deletes a delivery
still queued for it, so its sender never hears of it, or the receipts its sender has not read
yet. Migration 0016 lets no host role delete a queued delivery, and the recipient's host
delete a receipt only once the store's retention has passed."""

from __future__ import annotations

import psycopg
import pytest

from crossintercom.storage import LateReceipt
from crossintercom.storage.blocking import run
from tests.storage.test_host_roles_attack import Host, hosts  # noqa: F401  (a fixture)

pytestmark = pytest.mark.pg


def test_the_recipient_s_host_erases_nothing_its_sender_waits_for(
    hosts: dict[str, Host],  # noqa: F811
    pg_url: str,
) -> None:
    a, b = hosts["A"], hosts["B"]  # B sent A "to-a", still queued
    run(a.store.add_receipts(a.host, a.gen, [LateReceipt("to-a", "sa", b.host, "bs", "shown")]))
    with a.connect() as conn:
        for stmt in (
            "DELETE FROM public.deliveries WHERE message_id = 'to-a'",
            "DELETE FROM public.receipts WHERE message_id = 'to-a'",
            # and the relay's own purge, with a cutoff of its choosing
            "DELETE FROM public.deliveries WHERE finished_at IS NULL OR true",
            "DELETE FROM public.receipts WHERE created < now() + interval '1 year'",
        ):
            assert conn.execute(stmt).rowcount == 0, stmt
    assert run(a.store.purge(older_than_s=0)) == 0
    # the sender's host still has both: the delivery, and the receipt it has not read
    [receipt] = run(b.store.receipts(b.host, b.gen))
    assert (receipt.message_id, receipt.outcome) == ("to-a", "shown")
    with b.connect() as conn:
        state = conn.execute("SELECT state FROM public.deliveries WHERE message_id = 'to-a'")
        assert state.fetchall() == [("queued",)]
    # once past the retention, a receipt its sender never read is the recipient's to purge
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as admin:
        admin.execute("UPDATE receipts SET created = now() - interval '8 days'")
    run(a.store.purge(older_than_s=0))
    assert run(b.store.receipts(b.host, b.gen)) == []
