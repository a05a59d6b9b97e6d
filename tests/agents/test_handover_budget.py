"""One hand-over of mail to a model holds at most ``HANDOVER_BYTES`` of UTF-8
(docs/agents.md#one-hand-over): a burst of long messages, in ASCII and in emoji and CJK, reaches
the model over several MCP `inbox` calls and several hook wakes, each within the budget, every
message shown exactly once and in order; what a hand-over left out stays unseen and its sender
gets no `shown` receipt; one long message pages to its end in byte-bounded pages."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from crossintercom.agents.handover import framing
from crossintercom.agents.handover.mail import HANDOVER_BYTES, fit_mail
from crossintercom.client import Client, Identity
from crossintercom.inbox import Inbox
from tests.agents.conftest import (
    CLAUDE_STOP,
    CODEX_STOP,
    finish,
    hook,
    mcp_server,
    online,
    parse_mail,
    until,
)
from tests.conftest import run_cli, settings_for

# Sixteen thousand characters each: in ASCII, and in scripts of three and four bytes a character.
WIDE = ("\U0001f600\u6f22\u5b57\u304b\u306a\U0001f680 ", "\u4e2d\u6587\u6587\u672c\n")


def ascii_text(n: int) -> str:
    line = f"message {n:02d} says: the build is green and the tests pass.\n"
    return (f"[{n:02d}]\n" + line * 400)[: framing.TEXT_CHARS]


def wide_text(n: int) -> str:
    return (f"[{n:02d}]\n" + WIDE[n % 2] * 3000)[: framing.TEXT_CHARS]


def nbytes(text: str) -> int:
    return len(text.encode())


def planner(env: dict[str, str]) -> Client:
    cfg = settings_for(env)
    return Client(cfg, Identity.named(cfg, "planner")).connect()


def shown_receipts(env: dict[str, str]) -> set[str]:
    out = run_cli(env, "inbox", "--as", "planner", "--shown-receipts", "--json")
    assert out.returncode == 0, out.stderr
    return {r["id"] for r in json.loads(out.stdout) if r.get("outcome") == "shown"}


def unseen_ids(env: dict[str, str]) -> list[str]:
    cfg = settings_for(env)
    box = Inbox.of(cfg, Identity.named(cfg, "worker").id)
    try:
        return [str(e.body["id"]) for e in box.unshown() if e.kind == "message"]
    finally:
        box.close()


# --- the rendering alone ------------------------------------------------------------------------


def _message(i: int, text: str, **extra: Any) -> dict[str, Any]:
    return {"id": f"id-{i}", "from": {"name": "planner", "host": "B"}, "message": text, **extra}


def test_pages_are_measured_in_bytes_and_a_hand_over_fits_its_budget() -> None:
    emoji = "\U0001f600" * 20000
    end = framing.page_end(emoji, 0, framing.TEXT_CHARS, framing.TEXT_BYTES)
    assert end == framing.TEXT_BYTES // 4  # never four times the bytes of an ASCII page
    block = framing.render_block(_message(1, emoji))
    assert f"offset={end}" in block and f"{len(emoji) - end} more characters" in block
    # Quoting and defused markers make some text larger as shown: the first message is cut
    # to fit all the same, and the others wait.
    attached = [{"name": f"f{j}", "kind": "file", "content": "\u6f22" * 5000} for j in range(4)]
    for text in ("<<<\n" * 5000, "\n" * 20000, emoji, "x" * 20000):
        burst = [_message(i, text, attachments=attached) for i in range(20)]
        rendered, count = fit_mail(burst, "worker")
        assert nbytes(rendered) <= HANDOVER_BYTES and count >= 1
        assert len(parse_mail(rendered)) == count
        assert f"{20 - count} more unseen messages" in rendered.rsplit("\n", 1)[-1]


# --- the MCP inbox tool -------------------------------------------------------------------------


def test_mcp_inbox_hands_a_burst_over_within_the_budget_each_once(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    asyncio.run(_burst(cli_env, runtime_home))


async def _burst(env: dict[str, str], home: Path) -> None:
    async with mcp_server(env, "worker") as (worker, _):
        await until(lambda: online(home, "worker"), 30, "the MCP server to hold worker")
        texts = [ascii_text(n) for n in range(20)] + [wide_text(n) for n in range(20, 30)]
        with planner(env) as p:
            sent = [p.send("worker", t).id for t in texts]
            shown: list[str] = []
            calls = 0
            while True:
                calls += 1
                assert calls <= 2 * len(sent), "the inbox never emptied"
                text = str((await worker.call("inbox")).content[0].text)
                assert nbytes(text) <= HANDOVER_BYTES, nbytes(text)
                got = [m["id"] for m in parse_mail(text)]
                if not got:
                    assert text == "No unseen messages."
                    break
                shown += got
                left = len(sent) - len(shown)
                if left:
                    assert text.endswith(
                        f"[crossintercom: {left} more unseen message{'s' if left > 1 else ''} "
                        "not shown here, to keep this hand-over short; "
                        f"{'they stay' if left > 1 else 'it stays'} unseen: call the "
                        "crossintercom inbox tool again to read them.]"
                    ), text[-300:]
                if calls == 1:
                    # what the first call left out is still unseen, its senders told nothing
                    assert 1 <= len(got) < len(sent)
                    assert unseen_ids(env) == sent[len(got) :]
                    assert (await worker.data("whoami"))["unseen"] == left
                    await _receipts_for(env, set(got))
            assert shown == sent  # each exactly once, in order, none lost
            await until(lambda: shown_receipts(env) == set(sent), 30, "every shown receipt")
            assert calls > 10  # the burst did not fit a few results


async def _receipts_for(env: dict[str, str], expected: set[str]) -> None:
    """Once the `shown` receipts for ``expected`` came, the planner has those and no other."""
    await until(lambda: shown_receipts(env) >= expected, 30, "shown receipts")
    assert shown_receipts(env) == expected


def test_one_long_message_pages_to_its_end_in_byte_bounded_pages(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    asyncio.run(_long(cli_env, runtime_home))


async def _long(env: dict[str, str], home: Path) -> None:
    size = settings_for(env).max_message_bytes - 1000
    # ASCII, CJK and emoji lines: pages hold fewer characters where the bytes are wider
    text = "".join(
        f"{i:06d} " + ("\u6f22\u5b57 ascii\n" if i % 3 else "\U0001f680 rocket\n")
        for i in range(size // 20)
    ).rstrip("\n")
    assert 1_000_000 < nbytes(text) <= size
    async with mcp_server(env, "worker") as (worker, _):
        await until(lambda: online(home, "worker"), 30, "the MCP server to hold worker")
        with planner(env) as p:
            mid = p.send("worker", text).id
        page = str((await worker.call("inbox")).content[0].text)
        read, pages = "", 0
        while True:
            pages += 1
            assert nbytes(page) <= HANDOVER_BYTES, nbytes(page)
            (got,) = parse_mail(page)
            body = [x for x in got["message"].split("\n") if not x.startswith("[... ")]
            chunk = "\n".join(body)
            assert nbytes(chunk) <= framing.TEXT_BYTES
            assert text[len(read) :].startswith(chunk), (len(read), chunk[:80])
            read += chunk
            nxt = re.findall(rf'message_id="{mid}", offset=(\d+)', page)
            if not nxt:
                break
            assert int(nxt[0]) == len(read)
            page = await worker.text("inbox", message_id=mid, offset=int(nxt[0]))
        assert read == text and pages > nbytes(text) // framing.TEXT_BYTES


# --- the hooks ----------------------------------------------------------------------------------


def _wake(env: dict[str, str], fmt: str) -> tuple[int, str]:
    stdin = CLAUDE_STOP if fmt == "claude-hook" else CODEX_STOP
    rc, out, err = finish(hook(env, stdin, "--as", "worker", "--format", fmt, "--timeout", "5"))
    if fmt == "claude-hook":
        assert out == "", out
        return rc, err.removesuffix("\n") if rc == 2 else ""
    assert rc == 0, err
    return (2, json.loads(out)["reason"]) if out.strip() else (0, "")


def test_hook_wakes_hand_a_burst_over_within_the_budget_each_once(
    cli_env: dict[str, str],
) -> None:
    known = run_cli(cli_env, "wait", "--as", "worker", "--timeout", "0")  # a known mailbox
    assert known.returncode == 6, known.stderr
    texts = [ascii_text(n) for n in range(20)] + [wide_text(n) for n in range(20, 26)]
    with planner(cli_env) as p:
        sent = [p.send("worker", t).id for t in texts]
        shown: list[str] = []
        wakes = 0
        while True:
            fmt = "claude-hook" if wakes < 22 else "codex-hook"
            rc, text = _wake(cli_env, fmt)
            if rc != 2:
                break
            wakes += 1
            assert wakes <= 2 * len(sent), "the hook never ran dry"
            assert nbytes(text) <= HANDOVER_BYTES, (fmt, nbytes(text))
            got = [m["id"] for m in parse_mail(text)]
            assert got and got == sent[len(shown) : len(shown) + len(got)]
            shown += got
            if len(shown) < len(sent):
                assert "unseen: the next wake brings them" in text.rsplit("\n", 1)[-1]
                assert unseen_ids(cli_env) == sent[len(shown) :]
            if wakes == 1:
                assert shown_receipts_settle(cli_env, set(got))
        assert shown == sent
        assert wakes > 10


def shown_receipts_settle(env: dict[str, str], expected: set[str]) -> bool:
    """The planner's `shown` receipts, once those for ``expected`` came, are exactly those."""
    from tests.agents.conftest import wait_for

    wait_for(lambda: shown_receipts(env) >= expected, 30, "shown receipts")
    return shown_receipts(env) == expected
