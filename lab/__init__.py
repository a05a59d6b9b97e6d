"""Lab scripts: measurements docs/performance.md cites, kept out of the shipped package.

Run from a checkout's root, e.g. ``python -m lab.storecount 200``.
"""
