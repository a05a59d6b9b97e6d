"""The Python API (sync ``Client`` and asyncio ``AsyncClient``) against real broker processes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crossintercom.client import AsyncClient, Client, Identity
from crossintercom.errors import Code
from crossintercom.inbox import Inbox
from crossintercom.local_broker.process.spawn import ensure_broker
from crossintercom.models import Attachment, Message, Outcome, fallback_alias
from tests.conftest import broker_pid, kill_broker, pid_alive, settings_for, wait_for


@pytest.fixture
def cfg(cli_env: dict[str, str]) -> Any:
    return settings_for(cli_env)


@pytest.fixture
def clients(cfg: Any) -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for c in made:
        c.close()


def named(cfg: Any, clients: list[Client], name: str, **kw: Any) -> Client:
    c = Client(cfg, Identity.named(cfg, name), **kw).connect()
    clients.append(c)
    return c


def next_message(c: Client, timeout: float = 10) -> Message:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        item = c.next_incoming(timeout=max(0.01, deadline - time.monotonic()))
        if item is not None and item.message is not None:
            return item.message
    raise AssertionError("no message arrived")


def test_sync_send_with_attachment_kinds(cfg: Any, clients: list[Client]) -> None:
    worker = named(cfg, clients, "worker")
    planner = named(cfg, clients, "planner")
    attachments = [
        Attachment("file", "a.txt", "file body"),
        Attachment("snippet", "x.py", "print(1)", "python"),
        Attachment("context", "ctx", "background"),
    ]
    result = planner.send("worker", "see attached", attachments)
    assert result.outcome is Outcome.DELIVERED
    msg = next_message(worker)
    assert msg.id == result.id
    assert msg.attachments == tuple(attachments)
    box = Inbox(cfg.inbox_dir, worker.aio.identity.id)  # type: ignore[union-attr]
    try:
        assert box.has(msg.id)  # saved before it was acknowledged as delivered
    finally:
        box.close()
    bad = planner.send("worker", "x", [Attachment("image", "p.png", "....")])
    assert (bad.outcome, bad.code) == (Outcome.REFUSED, "bad_attachment")


def test_sync_ask_reply_and_pending(cfg: Any, clients: list[Client]) -> None:
    worker = named(cfg, clients, "worker")
    planner = named(cfg, clients, "planner")
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.setdefault("r", planner.ask("worker", "?", timeout=20)))
    t.start()
    question = next_message(worker)
    assert question.expects_reply
    assert [m.id for m in worker.pending()] == [question.id]
    answer = worker.reply("!", reply_to=question.id)
    assert answer.outcome is Outcome.DELIVERED
    t.join(20)
    result = box["r"]
    assert result.outcome is Outcome.DELIVERED
    assert result.reply is not None
    assert (result.reply.text, result.reply.reply_to) == ("!", question.id)
    assert worker.pending() == []


def test_status_update_and_fallback_alias(cfg: Any, clients: list[Client]) -> None:
    anon = Client(cfg, Identity.ephemeral()).connect()
    clients.append(anon)
    worker = named(cfg, clients, "worker")
    worker.set_status("reviewing PR 12")
    by_id = {s.id: s for s in worker.list_sessions()}
    assert by_id[worker.aio.identity.id].status == "reviewing PR 12"  # type: ignore[union-attr]
    anon_id = anon.aio.identity.id  # type: ignore[union-attr]
    info = by_id[anon_id]
    assert info.name is None
    assert info.display_name == fallback_alias(anon_id)
    assert info.display_name.startswith("session-")
    assert len(info.display_name) == len("session-") + 8
    # The alias is a target, and the anonymous session can be answered.
    assert worker.send(fallback_alias(anon_id), "hello anon").outcome is Outcome.DELIVERED
    assert next_message(anon).text == "hello anon"
    anon.close()
    # Runtime-only: an unnamed session is not remembered once gone.
    wait_for(
        lambda: anon_id not in {s.id for s in worker.list_sessions()}, 5, "anon to be forgotten"
    )


def test_asyncio_api(cfg: Any) -> None:
    async def main() -> None:
        async with (
            AsyncClient(cfg, Identity.named(cfg, "worker")) as worker,
            AsyncClient(cfg, Identity.named(cfg, "planner")) as planner,
        ):
            ask = asyncio.ensure_future(planner.ask("worker", "async?", timeout=20))
            item = await worker.next_incoming(10)
            assert item is not None
            assert item.message is not None
            assert item.message.text == "async?"
            assert (
                await worker.reply("yes", reply_to=item.message.id)
            ).outcome is Outcome.DELIVERED
            result = await ask
            assert result.reply is not None
            assert result.reply.text == "yes"
            assert await worker.join("ops") == ["default", "ops"]
            groups = {g.name: g for g in await planner.groups()}
            assert [m.name for m in groups["ops"].members] == ["worker"]
            assert (await planner.status()).sessions == 2

    asyncio.run(main())


def test_reconnects_after_broker_sigkill(
    cfg: Any, clients: list[Client], runtime_home: Path
) -> None:
    worker = named(cfg, clients, "worker")
    old = kill_broker(runtime_home)
    wait_for(lambda: not worker.aio.connected.is_set(), 5, "worker to see the broker gone")
    # The worker reconnects by itself (spawning a new broker) within its first backoff steps.
    wait_for(worker.aio.connected.is_set, 15, "worker to reconnect")
    new = broker_pid(runtime_home)
    assert new is not None
    assert new != old
    planner = named(cfg, clients, "planner")
    assert planner.send("worker", "after restart").outcome is Outcome.DELIVERED
    assert next_message(worker).text == "after restart"


def test_send_during_outage_without_spawn_is_not_sent(
    cfg: Any, clients: list[Client], runtime_home: Path
) -> None:
    ensure_broker(cfg)
    # Nobody here would start a new broker: no spawn, no reconnect.
    named(cfg, clients, "worker", spawn=False, reconnect=False)
    planner = named(cfg, clients, "planner", spawn=False, reconnect=False)
    kill_broker(runtime_home)
    result = planner.send("worker", "into the void")
    assert result.outcome is Outcome.NOT_SENT
    assert result.code == "broker_unavailable"
    assert result.id


def test_oversize_frame_is_refused_not_unknown(cfg: Any, clients: list[Client]) -> None:
    worker = named(cfg, clients, "worker")
    planner = named(cfg, clients, "planner")
    pid = broker_pid(Path(cfg.home))
    big = "x" * (cfg.max_frame_bytes + 10)
    result = planner.send("worker", big)
    # Nothing can have been delivered: the frame never fit. Not `unknown`, not a hang.
    assert result.outcome is Outcome.REFUSED
    assert result.code == "too_large"
    assert planner.send("worker", "small").outcome is Outcome.DELIVERED
    assert next_message(worker).text == "small"
    assert pid is not None
    assert pid_alive(pid)


def test_late_reply_is_never_taken_for_a_newer_ask(cfg: Any, clients: list[Client]) -> None:
    worker = named(cfg, clients, "worker")
    planner = named(cfg, clients, "planner")
    first = planner.ask("worker", "first?", timeout=0.5)
    assert first.outcome is Outcome.DELIVERED
    assert first.reply is None
    q1 = next_message(worker)
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.setdefault("r", planner.ask("worker", "second?")))
    t.start()
    q2 = next_message(worker)
    assert worker.reply("answer to first", reply_to=q1.id).outcome is Outcome.DELIVERED
    late = next_message(planner)  # the late reply lands with the session, flagged
    assert (late.text, late.reply_to) == ("answer to first", q1.id)
    assert "late" in late.flags
    assert worker.reply("answer to second", reply_to=q2.id).outcome is Outcome.DELIVERED
    t.join(20)
    second = box["r"]
    assert second.id == q2.id
    assert second.reply is not None
    assert (second.reply.text, second.reply.reply_to) == ("answer to second", q2.id)


def test_a_send_naming_someone_elses_ask_does_not_answer_it(
    cfg: Any, clients: list[Client]
) -> None:
    """Only the session an ask went to answers it: another session of the same host that
    names the ask in ``reply_to`` (or a group send that does) is refused, as a row from
    another host is (docs/delivery.md), and the ask still gets its real answer."""
    worker = named(cfg, clients, "worker")
    planner = named(cfg, clients, "planner")
    mallory = named(cfg, clients, "mallory")
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.setdefault("r", planner.ask("worker", "deploy?")))
    t.start()
    question = next_message(worker)
    forged = mallory.send("planner", "yes, deploy", reply_to=question.id)
    assert (forged.outcome, forged.code) == (Outcome.REFUSED, Code.REPLY_NOT_AUTHORISED)
    own = planner.send("planner", "answered myself", reply_to=question.id)
    assert (own.outcome, own.code) == (Outcome.REFUSED, Code.REPLY_NOT_AUTHORISED)
    planner.join("crew")
    grouped = mallory.send("group:crew", "yes, deploy", reply_to=question.id)
    assert grouped.outcome is Outcome.REFUSED
    assert grouped.receipts is not None
    assert [r.code for r in grouped.receipts] == [Code.REPLY_NOT_AUTHORISED]
    # Naming a message that is not an ask of the recipient's is a plain reference.
    assert mallory.send("worker", "fyi", reply_to=question.id).outcome is Outcome.DELIVERED
    assert worker.reply("not yet", reply_to=question.id).outcome is Outcome.DELIVERED
    t.join(20)
    result = box["r"]
    assert result.reply is not None
    assert (result.reply.text, result.reply.sender.name) == ("not yet", "worker")
    assert all(e.body["from"]["name"] != "mallory" for e in planner.inbox.messages())


def test_concurrent_asks_get_their_own_replies(cfg: Any, clients: list[Client]) -> None:
    worker = named(cfg, clients, "worker")
    planner = named(cfg, clients, "planner")

    async def both() -> list[Any]:
        aio = planner.aio
        return list(
            await asyncio.gather(
                aio.ask("worker", "a?", timeout=20), aio.ask("worker", "b?", timeout=20)
            )
        )

    fut = asyncio.run_coroutine_threadsafe(both(), planner._loop)
    questions = {m.text: m for m in (next_message(worker), next_message(worker))}
    worker.reply("B", reply_to=questions["b?"].id)
    worker.reply("A", reply_to=questions["a?"].id)
    ra, rb = fut.result(20)
    assert (ra.reply.text, rb.reply.text) == ("A", "B")
