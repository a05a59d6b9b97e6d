"""The `crossintercom` command line (click); ``main.cli`` is the root group."""
