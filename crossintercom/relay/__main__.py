"""`python -m crossintercom.relay`: the relay in the foreground (same as `crossintercom relay`)."""

from crossintercom.cli.main import cli

if __name__ == "__main__":
    cli(["relay"], prog_name="crossintercom")
