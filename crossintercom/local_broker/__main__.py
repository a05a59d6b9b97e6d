"""`python -m crossintercom.local_broker`: what a client spawns (as `crossintercom broker`)."""

from __future__ import annotations

import sys

from crossintercom.config import load_settings
from crossintercom.errors import CrossintercomError
from crossintercom.local_broker.run import run_broker


def main() -> int:
    try:
        run_broker(load_settings())
    except CrossintercomError as exc:
        print(f"crossintercom broker: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
