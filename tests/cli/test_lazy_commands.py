"""Each command's module is imported when that command runs (docs/architecture.md,
"Start-up"): the table in `cli/main.py` names every command each module offers, help lists
them all, and the commands a harness runs on every turn start without the store's and the web
page's libraries."""

from __future__ import annotations

import importlib
import subprocess
import sys

import click
import pytest

from crossintercom.cli.main import COMMAND_MODULES, cli, load_command

HEAVY = ("sqlalchemy", "psycopg", "alembic", "starlette", "uvicorn", "jinja2", "mcp")


def test_the_table_names_every_command_of_every_module() -> None:
    offered: dict[str, str] = {}
    for module in set(COMMAND_MODULES.values()):
        found = importlib.import_module(f"crossintercom.cli.{module}")
        commands = getattr(found, "COMMANDS", None) or [getattr(found, module)]
        offered.update({c.name: module for c in commands if c.name})
    assert offered == COMMAND_MODULES
    for name in COMMAND_MODULES:
        assert load_command(name).name == name


def test_help_lists_every_command() -> None:
    shown = cli.list_commands(click.Context(cli))
    assert shown == sorted(COMMAND_MODULES)
    out = subprocess.run(
        [sys.executable, "-m", "crossintercom", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert all(f"  {name} " in out or f"  {name}\n" in out for name in COMMAND_MODULES)


def test_an_unknown_command_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "crossintercom", "sned"], check=False, capture_output=True, text=True
    )
    assert done.returncode == 2 and "No such command 'sned'" in done.stderr


@pytest.mark.parametrize("name", ["wait", "send", "listen", "inbox", "reply", "mcp"])
def test_a_turns_command_starts_without_the_heavy_libraries(name: str) -> None:
    probe = (
        "import sys\n"
        "from crossintercom.cli.main import load_command\n"
        f"load_command({name!r})\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
