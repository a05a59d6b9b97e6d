"""The one outcome model (models.py): every surface merges a recipient's receipts by one
order. Any sequence of receipts, merged by the overseer's live feed and by the archive (its
batch rule and the store's statements, run here on an in-memory SQLite), ends in the same
outcome; and every outcome a row or frame type names is an ``Outcome``."""

from __future__ import annotations

import ast
from functools import reduce
from pathlib import Path
from typing import Any, get_args

from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, create_engine, select

from crossintercom import models
from crossintercom.codes import Code
from crossintercom.models import (
    DELIVERY_STATES,
    PROGRESS,
    RECEIPT_OUTCOMES,
    SETTLED,
    AckOutcome,
    LateReceiptOutcome,
    Outcome,
    State,
    further,
)
from crossintercom.protocol.relay_frames import HostReceiptOutcome
from crossintercom.storage import queries as q
from crossintercom.storage.archive_types import ArchiveRecipient
from crossintercom.storage.tables import archive_recipients
from crossintercom.web.feedstore import _merge_receipt

OUTCOMES = [o.value for o in Outcome]
# (outcome, code, whether it reaches the archive as a later receipt's update rather than a copy)
receipts = st.lists(
    st.tuples(
        st.sampled_from(OUTCOMES),
        st.sampled_from([None, Code.SENDER_REFUSED.value, Code.EXPIRED.value]),
        st.booleans(),
    ),
    min_size=1,
    max_size=12,
)


def _archived(conn: Connection, seq: list[tuple[str, str | None, bool]]) -> str:
    archive_recipients.create(conn)
    for i, (outcome, code, late) in enumerate(seq):
        if late and i:
            row = {"mid": "m", "sid": "s", "host": "h", "new_outcome": outcome, "new_code": code}
            conn.execute(q.ARCHIVE_RECEIPT_UPDATE, [row])
        else:
            r = ArchiveRecipient("s", "h", outcome, None, code)
            row2: dict[str, Any] = {"message_id": "m", "session_id": r.session_id,
                                    "host_id": r.host_id, "name": r.name,
                                    "outcome": r.outcome, "code": r.code}  # fmt: skip
            conn.execute(q.archive_recipients_upsert("sqlite"), [row2])
    return str(conn.execute(select(archive_recipients.c.outcome)).scalar_one())


@settings(max_examples=200, deadline=None)
@given(receipts)
def test_the_feed_and_the_archive_end_in_the_same_outcome(
    seq: list[tuple[str, str | None, bool]],
) -> None:
    feed: list[dict[str, Any]] = []
    for outcome, code, _ in seq:
        _merge_receipt(feed, {"session_id": "s", "host": "h", "outcome": outcome, "code": code})
    engine = create_engine("sqlite://")
    try:
        with engine.begin() as conn:
            archived = _archived(conn, seq)
    finally:
        engine.dispose()
    # The archive's rule within one batch (ArchiveStore.archive) is the same order again.
    batch = reduce(lambda old, new: new if further(new, old) else old, [o for o, *_ in seq])
    assert feed[0]["outcome"] == archived == batch
    # ...and it is the furthest along, the first of its rank.
    top = max(PROGRESS[o] for o, *_ in seq)
    assert archived == next(o for o, *_ in seq if PROGRESS[o] == top)


def test_the_order_covers_every_outcome_and_failures_end_it() -> None:
    assert set(PROGRESS) == set(Outcome)
    last = max(PROGRESS.values())
    assert {o for o, r in PROGRESS.items() if r == last} == {
        Outcome.REFUSED,
        Outcome.EXPIRED,
        Outcome.NOT_SENT,
    }
    assert [
        o for o in Outcome if o not in SETTLED and PROGRESS[o] >= PROGRESS[Outcome.ACKNOWLEDGED]
    ] == []


def test_every_outcome_a_type_names_is_an_outcome() -> None:
    for names in (RECEIPT_OUTCOMES, get_args(AckOutcome), get_args(LateReceiptOutcome)):
        assert set(names) <= set(OUTCOMES), names
    assert get_args(HostReceiptOutcome) == get_args(LateReceiptOutcome)
    assert set(DELIVERY_STATES) <= {s.value for s in State}


# Where an outcome or a delivery state is compared, set or sent, it is named through the model
# (``Outcome``, ``State``, or their ``.value``), never spelt again. "unknown" also names a
# lease and a replication mode, so it is left out of the search.
_WORDS = {o.value for o in Outcome} | {s.value for s in State}
_SPELT_ONCE = ("relay", "web", "storage")


def test_no_outcome_is_spelt_outside_the_model() -> None:
    package = Path(models.__file__).parent
    found = []
    for folder in _SPELT_ONCE:
        for path in sorted((package / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                    continue
                if node.value in _WORDS - {"unknown"}:
                    found.append(f"{path.relative_to(package)}:{node.lineno}: {node.value}")
    assert found == []
