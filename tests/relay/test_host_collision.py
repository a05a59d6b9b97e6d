"""Two machines configured with one host id (a cloned VM, a copied env file): the second is
refused, naming the collision, instead of the two fencing each other in a loop."""

from __future__ import annotations

from tests.relay.conftest import Cluster, wait_for


def test_second_machine_with_the_same_host_id_is_refused(cluster: Cluster) -> None:
    a, first = cluster.up("A", "B")
    worker = first.listen("worker")
    a.wait_sees("worker", "B")
    machine = (first.home / "machine.id").read_text().strip()

    clone = cluster.host("B", dirname="B-clone", relay=False)
    for _ in range(2):  # as a service manager would restart it
        proc = clone.spawn_relay()
        assert proc.wait(60) != 0
        log = clone.relay_log(proc)
        assert "host id 'B' is in use by another machine" in log, log
        assert machine in log, log
        assert "CROSSINTERCOM_HOST_ID" in log

    # The first machine was never fenced: its relay runs and mail reaches it.
    assert first.relay is not None and first.relay.poll() is None, first.relay_log()[-2000:]
    assert "took over" not in first.relay_log()
    sender = a.client("boss")
    assert sender.send("worker@B", "still here").outcome.value == "delivered"
    wait_for(lambda: len(worker.message_ids()) == 1, 10, "the message on the first machine")


def test_host_id_moves_to_a_new_machine_once_the_old_relay_is_gone(cluster: Cluster) -> None:
    a, old = cluster.up("A", "B")
    old.stop_relay()
    new = cluster.host("B", dirname="B-new", lease_s=2)
    assert new.relay is not None and new.relay.poll() is None
    assert "moves to this machine" in new.relay_log()
    new.listen("worker")
    a.wait_sees("worker", "B")
    assert a.client("boss").send("worker@B", "hello").outcome.value == "delivered"
