"""`crossintercom status --all-hosts [--json]`: every host of the store, read from the store:
its version, its lease's age, the mail waiting for it and the oldest, its relay's last error,
the schema and replication."""

from __future__ import annotations

from crossintercom.relay.metrics import package_version
from tests.relay.conftest import Cluster


def test_every_host_with_its_lease_and_waiting_mail(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    b.listen("worker")
    a.wait_sees("worker", "B")
    b.stop_relay()
    for n in range(2):
        sent = a.cli_json("send", "--as", "planner", "--to", "worker", f"while away {n}")
        assert sent["outcome"] == "queued", sent

    report = a.cli_json("status", "--all-hosts", "--json")
    assert report["schema_revision"]
    hosts = {h["host_id"]: h for h in report["hosts"]}
    assert set(hosts) == {"A", "B"}
    assert hosts["B"]["queued"] == 2
    assert hosts["B"]["oldest_queued_age_s"] is not None
    assert hosts["B"]["oldest_queued_age_s"] >= 0
    assert hosts["A"]["queued"] == 0 and hosts["A"]["oldest_queued_age_s"] is None
    for h in hosts.values():
        assert h["generation"] == 1
        assert h["lease_age_s"] is not None and h["lease_age_s"] >= 0
        assert set(h) == {
            "host_id",
            "generation",
            "lease_age_s",
            "queued",
            "oldest_queued_age_s",
            "version",
            "last_error",
            "unreadable",
        }
        # Each relay wrote its version at its claim; no store operation of theirs failed.
        assert h["version"] == package_version() and h["unreadable"] == []
        assert h["last_error"] is None
    if cluster.store_url.startswith("postgresql"):
        assert report["replication"]["mode"]

    # The text form: one row per host (B's relay is stopped, so nobody else reads the store).
    out = a.cli("status", "--all-hosts")
    assert out.returncode == 0, out.stderr
    assert "A" in out.stdout and "B" in out.stdout and "schema" in out.stdout
