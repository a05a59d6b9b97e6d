"""`python -m crossintercom.local_broker`: what a client spawns (as `crossintercom broker`)."""

from __future__ import annotations

import faulthandler
import sys

from crossintercom.config import load_settings
from crossintercom.errors import CrossintercomError
from crossintercom.local_broker.process.run import run_broker


def main() -> int:
    # A fatal signal (SIGBUS from a mapped file, SIGSEGV) leaves a traceback in broker.log
    # (its stderr) instead of a silent death.
    faulthandler.enable()
    try:
        run_broker(load_settings())
    except CrossintercomError as exc:
        print(f"crossintercom broker: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
