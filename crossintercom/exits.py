"""The CLI's exit codes (README "Exit codes"): scripts and agents branch on them.

One table for the command line and for the overseer page, which shows what the CLI would have
exited with for the same send (docs/web.md)."""

from __future__ import annotations

from typing import Final

from crossintercom.models import Outcome, SendResult

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_REFUSED: Final = 3
EXIT_NOT_SENT: Final = 4
EXIT_UNKNOWN: Final = 5
EXIT_NO_REPLY: Final = 6

OUTCOME_EXIT: Final = {
    Outcome.DELIVERED: EXIT_OK,
    Outcome.QUEUED: EXIT_OK,
    Outcome.REFUSED: EXIT_REFUSED,
    Outcome.NOT_SENT: EXIT_NOT_SENT,
    Outcome.UNKNOWN: EXIT_UNKNOWN,
    Outcome.EXPIRED: EXIT_REFUSED,
    Outcome.SHOWN: EXIT_OK,
    Outcome.ACKNOWLEDGED: EXIT_OK,
}


def result_exit_code(result: SendResult, *, with_reply: bool = False) -> int:
    """A send's, ask's or reply's exit code: its outcome's, or ``EXIT_NO_REPLY`` for an ask
    that went out but got no reply in time."""
    code = OUTCOME_EXIT[result.outcome]
    if with_reply and code == EXIT_OK and result.reply is None:
        return EXIT_NO_REPLY
    return code
