"""Bytes that are not UTF-8, on the command line (Python holds them as lone surrogates) or on
standard input, and a number that is "nan", are usage errors before anything is done: exit 2,
`invalid_argument`, no traceback, no hang, and the mail sent next is the first the recipient
gets."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import CLI, Listener, run_cli

NOT_UTF8 = os.fsdecode(b"n\xff\xfeame")


@pytest.mark.parametrize(
    "args",
    [
        ("send", "--as", "planner", "--to", "worker", NOT_UTF8),
        ("send", "--as", "planner", "--to", NOT_UTF8, "hello"),
        ("send", "--as", "planner", "--to", "worker", "--subject", NOT_UTF8, "hello"),
        ("send", "--as", "planner", "--to", "worker", "--thread", NOT_UTF8, "hello"),
        ("reply", "--as", "planner", "--reply-to", NOT_UTF8, "hello"),
        ("inbox", "--as", "planner", "--message", NOT_UTF8),
        ("ack", "--as", "planner", NOT_UTF8),
        ("resend", "--as", "planner", NOT_UTF8),
        ("inbound", "--as", "planner", NOT_UTF8, "hold"),
        ("reserve", "--as", "planner", "--project", NOT_UTF8, "src/*"),
    ],
)
def test_arguments_that_are_not_utf8_are_a_usage_error(
    cli_env: dict[str, str], args: tuple[str, ...]
) -> None:
    out = run_cli(cli_env, "--json", *args)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert json.loads(out.stdout)["error"]["code"] == "invalid_argument"
    plain = run_cli(cli_env, *args)
    assert plain.returncode == 2
    assert "not UTF-8" in plain.stderr
    assert "Traceback" not in plain.stderr


def test_standard_input_that_is_not_utf8_is_a_usage_error(cli_env: dict[str, str]) -> None:
    with Listener(cli_env, "worker") as worker:
        for extra in ((), ("--json",)):
            bad = subprocess.run(
                [*CLI, *extra, "send", "--as", "planner", "--to", "worker", "-"],
                env=cli_env,
                input=b"before \xff after",
                capture_output=True,
                timeout=30,
                check=False,
            )
            err = bad.stderr.decode(errors="replace")
            assert bad.returncode == 2, err
            assert "Traceback" not in err
            assert "not UTF-8" in err + bad.stdout.decode(errors="replace")
        # read as a text stream reads it: universal newlines, as before the bytes were checked
        good = run_cli(
            cli_env, "send", "--as", "planner", "--to", "worker", "-", input="next\r\nline"
        )
        assert good.returncode == 0, good.stderr
        (first,) = worker.messages(1)
        assert first["message"] == "next\nline"


@pytest.mark.parametrize(
    "args",
    [
        ("wait", "--as", "planner", "--timeout", "nan"),
        ("wait", "--as", "planner", "--timeout", "0", "--settle", "NaN"),
        ("ask", "--as", "planner", "--to", "worker", "--timeout", "nan", "q"),
        ("web", "--queued-after", "nan"),
        ("chaos", "--duration", "nan"),
    ],
)
def test_nan_is_not_a_number(cli_env: dict[str, str], args: tuple[str, ...]) -> None:
    out = run_cli(cli_env, "--json", *args, timeout=20)
    assert out.returncode == 2, out.stderr
    assert json.loads(out.stdout)["error"]["code"] == "invalid_argument"
