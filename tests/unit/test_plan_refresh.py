"""The schedule on which a store connection drops its plans (storage/plans.py)."""

from __future__ import annotations

from crossintercom.storage.plans import MAX_AFTER_STATEMENTS, PlanRefresh


def test_refreshes_come_after_doubling_counts_of_statements() -> None:
    plans = PlanRefresh(after_s=1e9, after_statements=4)
    due_at = [n for n in range(1, 4 + 8 + 16 + 1) if plans.due()]
    assert due_at == [4, 12, 28]
    assert plans.refreshes == 3


def test_a_refresh_comes_after_its_time_with_few_statements() -> None:
    plans = PlanRefresh(after_s=0.0, after_statements=10**9)
    assert plans.due()
    assert plans.after_s == 0.0  # doubled from nothing: stays due at every call
    assert plans.due()


def test_the_gaps_stop_growing_at_their_caps() -> None:
    plans = PlanRefresh(after_s=1e9, after_statements=MAX_AFTER_STATEMENTS)
    for _ in range(MAX_AFTER_STATEMENTS):
        plans.due()
    assert plans.refreshes == 1
    assert plans.after_statements == MAX_AFTER_STATEMENTS
