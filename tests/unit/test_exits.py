"""The CLI's exit codes (README "Exit codes") are one table, which the overseer page reads too."""

from __future__ import annotations

from crossintercom import exits
from crossintercom.cli import output
from crossintercom.models import Outcome, SendResult
from crossintercom.web import overseer


def test_every_outcome_has_an_exit_code() -> None:
    assert set(exits.OUTCOME_EXIT) == set(Outcome)
    assert {o for o, c in exits.OUTCOME_EXIT.items() if c == exits.EXIT_OK} == {
        Outcome.DELIVERED,
        Outcome.QUEUED,
        Outcome.SHOWN,
        Outcome.ACKNOWLEDGED,
    }


def test_an_ask_without_a_reply_is_exit_6_only_when_it_went_out() -> None:
    sent = SendResult("m", Outcome.DELIVERED)
    assert exits.result_exit_code(sent) == exits.EXIT_OK
    assert exits.result_exit_code(sent, with_reply=True) == exits.EXIT_NO_REPLY == 6
    refused = SendResult("m", Outcome.REFUSED)
    assert exits.result_exit_code(refused, with_reply=True) == exits.EXIT_REFUSED == 3


def test_the_cli_and_the_overseer_page_read_the_same_table() -> None:
    for user in (output, overseer):
        assert vars(user)["result_exit_code"] is exits.result_exit_code, user.__name__
