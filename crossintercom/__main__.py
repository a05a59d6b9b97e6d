"""`python -m crossintercom`: the command line, as the installed `crossintercom` script runs it."""

from crossintercom.cli.main import main

if __name__ == "__main__":
    main()
