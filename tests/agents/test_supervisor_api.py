"""The escalation Python API (`crossintercom.agents.escalations.supervisor`) against a real
broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from crossintercom.agents.escalations import supervisor as sup
from crossintercom.agents.escalations.escalation import EscalationError, escalation_of
from crossintercom.client import Client, Identity
from crossintercom.models import Outcome
from tests.conftest import settings_for


@pytest.fixture
def pair(cli_env: dict[str, str]) -> Iterator[tuple[Client, Client]]:
    cfg = settings_for(cli_env)
    worker = Client(cfg, Identity.named(cfg, "worker")).connect()
    lead = Client(cfg, Identity.named(cfg, "lead")).connect()
    yield worker, lead
    worker.close()
    lead.close()


def first_pending(lead: Client, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (asks := lead.pending()):
        assert time.monotonic() < deadline, "no escalation reached the supervisor"
        time.sleep(0.05)
    return asks[0]


def test_decision_round_trip_with_the_sync_api(pair: tuple[Client, Client]) -> None:
    worker, lead = pair
    results: list[sup.EscalationResult] = []
    asking = threading.Thread(
        target=lambda: results.append(
            sup.need_decision_sync(worker, "lead", "Ship it?", options=["yes", "no"], timeout=60)
        )
    )
    asking.start()
    ask = first_pending(lead)
    esc = escalation_of(ask.to_dict())
    assert esc is not None and esc.kind == "need_decision"
    with pytest.raises(EscalationError) as refused:
        sup.answer_sync(lead, ask.id, {"decision": "maybe"})
    assert "'maybe' is not one of the options" in refused.value.message
    assert lead.pending(), "a refused answer is not sent"
    assert sup.answer_sync(lead, ask.id, {"decision": "yes"}).outcome is Outcome.DELIVERED
    asking.join(60)
    (result,) = results
    assert result.answer is not None and result.answer.valid
    assert result.answer.responses == {"decision": "yes"}
    assert (
        result.to_dict()["answer"]["raw"] == '{"responses": [{"id": "decision", "value": "yes"}]}'
    )


def test_progress_needs_no_answer(pair: tuple[Client, Client]) -> None:
    worker, lead = pair
    result = sup.progress_sync(worker, "lead", "tests pass", percent=90)
    assert result.sent.outcome is Outcome.DELIVERED and result.answer is None
    assert lead.pending() == []
