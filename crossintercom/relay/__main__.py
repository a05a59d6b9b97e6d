"""`python -m crossintercom.relay`: the relay in the foreground, as `crossintercom relay` runs it.

The store comes from ``CROSSINTERCOM_STORE``; warnings and errors go to stderr in the CLI's
format, and an error ends the process with its exit code.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys

from crossintercom.config import load_settings
from crossintercom.errors import CrossintercomError
from crossintercom.relay import logs
from crossintercom.relay.run import ENV_POLLING_OBSERVER, polling_from_env, run_relay
from crossintercom.relay.syncguard import ENV_REQUIRE_SYNC


def main() -> int:
    faulthandler.enable()  # a fatal signal leaves a traceback on stderr, not a silent death
    try:
        settings = load_settings()
    except CrossintercomError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    # Structured fields (the message id, the error) are part of what a line says.
    logs.configure(logging.WARNING, settings.log_format)
    try:
        require_sync = os.environ.get(ENV_REQUIRE_SYNC, "") in ("1", "true", "yes")
        polling = polling_from_env(os.environ.get(ENV_POLLING_OBSERVER))
        run_relay(settings, polling_observer=polling, require_sync=require_sync)
    except CrossintercomError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
