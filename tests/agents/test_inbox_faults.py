"""The long-running surfaces outlive a failing inbox: `listen` (every format), `wait` (every
format, the hook ones too) and the MCP server keep running while their inbox file is immutable or
its disk is full under traffic; `status` names the fault and since when; once it clears, every
message sent meanwhile is shown exactly once within seconds, by itself (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crossintercom.client import Client, Identity
from tests.agents.conftest import (
    CLAUDE_STOP,
    CODEX_STOP,
    Mcp,
    hook,
    mcp_server,
    online,
    parse_mail,
    spawn,
    until,
)
from tests.conftest import cli_json, settings_for, wait_for
from tests.inbox_fault import KINDS, NEEDS_ROOT, InboxFault, inbox_fault

pytestmark = NEEDS_ROOT

# Mail resumes this soon after the fault clears (the client registers again every 5 s).
RECOVERY_S = 30.0
PER_NAME = 3
ACKED = {"delivered", "queued"}
# A message's id where its text shows begin (a framed message repeats it on its end line).
_ID = re.compile(r"(?<!message )id=([0-9a-f-]{36})")

# name -> (command, format): listeners run until stopped, waiters until they handed mail over
LISTENERS = {"lj": "json", "lt": "text", "ll": "line"}
WAITERS = {"wj": "json", "wt": "text", "wc": "claude-hook", "wx": "codex-hook"}
HOOK_INPUT: dict[str, dict[str, Any]] = {"claude-hook": CLAUDE_STOP, "codex-hook": CODEX_STOP}
MAIL_EXIT = {"json": 0, "text": 0, "claude-hook": 2, "codex-hook": 0}


@pytest.fixture(params=KINDS)
def fault(request: pytest.FixtureRequest, runtime_home: Path) -> Iterator[InboxFault]:
    yield from inbox_fault(request.param, runtime_home / "inbox")


class Surface:
    """One surface process; its whole output is kept (both streams) as it comes."""

    def __init__(self, env: dict[str, str], name: str, fmt: str, *, waiter: bool) -> None:
        self.env, self.name, self.fmt, self.waiter = env, name, fmt, waiter
        self.shown: Counter[str] = Counter()
        self.runs: list[tuple[int, str, str]] = []
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[str]:
        if self.waiter:
            proc = hook(
                self.env,
                HOOK_INPUT.get(self.fmt),
                *("--as", self.name, "--format", self.fmt, "--timeout", "300"),
            )
        else:
            proc = spawn(self.env, "listen", "--as", self.name, "--format", self.fmt)
        self.out: list[str] = []
        self.err: list[str] = []
        self.pumps = [
            threading.Thread(target=_pump, args=(stream, into), daemon=True)
            for stream, into in ((proc.stdout, self.out), (proc.stderr, self.err))
        ]
        for t in self.pumps:
            t.start()
        return proc

    def _reap(self) -> None:
        """The process has ended: its output read to the end, its pipes closed."""
        self.proc.wait(10)
        for t in self.pumps:
            t.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def ids(self) -> Counter[str]:
        """Message ids shown so far, as often as each was shown (every run of a waiter)."""
        out = "".join(self.out)
        if self.fmt == "json" and not self.waiter:
            lines = [json.loads(line) for line in out.splitlines() if line.strip()]
            found = [m["id"] for m in lines if m.get("type") == "message"]
        elif self.fmt == "json":
            found = [m["id"] for m in json.loads(out or "[]")]
        else:
            found = _ID.findall(out + ("".join(self.err) if self.fmt == "claude-hook" else ""))
        return self.shown + Counter(found)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def step(self) -> None:
        """A waiter that handed its mail over ends; what it showed is kept and it runs again
        (a harness starts the hook again at the next stop)."""
        if self.waiter and not self.alive():
            self._reap()
            rc = self.proc.returncode
            assert rc == MAIL_EXIT[self.fmt], (self.name, rc, self.out, self.err)
            self.shown = self.ids()
            self.runs.append((rc, "".join(self.out), "".join(self.err)))
            self.proc = self._start()

    def stop(self) -> None:
        if self.alive():
            self.proc.kill()
        self._reap()


def _pump(stream: Any, into: list[str]) -> None:
    for line in stream:
        into.append(line)


def _warnings(env: dict[str, str]) -> list[str]:
    found: list[str] = cli_json(env, "status")["warnings"]
    return found


def _names_faulted(env: dict[str, str], names: list[str]) -> bool:
    """Every NAME has a warning line naming it and since when its inbox fails."""
    lines = _warnings(env)
    return all(any(f"{n} cannot" in w and " since " in w for w in lines) for n in names)


def test_listen_and_wait_outlive_a_failing_inbox_and_show_each_message_once(
    cli_env: dict[str, str], fault: InboxFault
) -> None:
    settings = settings_for(cli_env)
    names = [*LISTENERS, *WAITERS]
    sids = {n: Identity.named(settings, n).id for n in names}
    surfaces = [Surface(cli_env, n, f, waiter=False) for n, f in LISTENERS.items()]
    surfaces += [Surface(cli_env, n, f, waiter=True) for n, f in WAITERS.items()]
    try:
        home = Path(cli_env["CROSSINTERCOM_HOME"])
        for s in surfaces:
            wait_for(functools.partial(online, home, s.name), 30, f"{s.name} to be online")
            inbox = settings.inbox_dir / f"{sids[s.name]}.sqlite"
            wait_for(inbox.exists, 30, f"{s.name}'s inbox to exist")
        with Client(settings, Identity.named(settings, "mate")) as mate:
            before = {n: mate.send(n, "before").id for n in LISTENERS}
            wait_for(
                lambda: all(surfaces[i].ids()[before[n]] == 1 for i, n in enumerate(LISTENERS)),
                20,
                "the listeners to show the first message",
            )

            fault.on(*sids.values())
            sent: dict[str, list[str]] = {n: [] for n in names}
            for k in range(PER_NAME):
                for n in names:
                    result = mate.send(n, f"during the fault {k}")
                    assert result.outcome.value in ACKED, result
                    sent[n].append(result.id)

            def up_and_faulted() -> bool:
                for s in surfaces:
                    assert s.alive(), f"{s.name} ({s.fmt}) died: {''.join(s.err)[-2000:]}"
                return _names_faulted(cli_env, names)

            wait_for(up_and_faulted, 30, "status to name every fault")
            fault.off()
            cleared = time.monotonic()

            def all_shown() -> bool:
                for s in surfaces:
                    s.step()
                return all(set(sent[s.name]) <= set(s.ids()) for s in surfaces)

            wait_for(all_shown, RECOVERY_S, "every message sent during the fault to be shown")
            took = time.monotonic() - cleared
            print(
                f"inbox fault ({fault.kind}): {len(surfaces)} surfaces showed all "
                f"{PER_NAME * len(names)} messages {took:.1f} s after it cleared"
            )
            for s in surfaces:
                shown = s.ids()
                assert all(shown[m] == 1 for m in sent[s.name]), (s.name, s.fmt, shown)
                if not s.waiter:
                    assert s.alive(), f"{s.name} ({s.fmt}) died: {''.join(s.err)[-2000:]}"
            wait_for(
                lambda: not any(f"{n} cannot" in w for w in _warnings(cli_env) for n in names),
                RECOVERY_S,
                "the inbox warnings to clear",
            )
    finally:
        for s in surfaces:
            s.stop()


def test_mcp_server_answers_inbox_unavailable_meanwhile_and_resumes(
    cli_env: dict[str, str], fault: InboxFault
) -> None:
    asyncio.run(_mcp_under_fault(cli_env, fault))


async def _inbox_ids(worker: Mcp) -> tuple[list[str], str | None]:
    """One `inbox` call: the ids it showed, and the error code if it failed."""
    result = await worker.call("inbox")
    if result.is_error:
        return [], str(result.structured_content["error"]["code"])
    # Mail results carry no structured content: the ids come from the frames.
    return [m["id"] for m in parse_mail(str(result.content[0].text))], None


async def _mcp_under_fault(env: dict[str, str], fault: InboxFault) -> None:
    settings = settings_for(env)
    sid = Identity.named(settings, "mw").id
    async with mcp_server(env, "mw") as (worker, _):
        home = Path(env["CROSSINTERCOM_HOME"])
        await until(lambda: online(home, "mw"), 30, "mw to be online")
        with Client(settings, Identity.named(settings, "mate")) as mate:
            first = await asyncio.to_thread(mate.send, "mw", "before")
            assert first.outcome.value == "delivered", first
            assert (await _inbox_ids(worker))[0] == [first.id]

            fault.on(sid)
            sent = []
            for k in range(PER_NAME):
                result = await asyncio.to_thread(mate.send, "mw", f"during the fault {k}")
                assert result.outcome.value in ACKED, result
                sent.append(result.id)
            codes: list[str | None] = []

            async def refused() -> bool:
                ids, code = await _inbox_ids(worker)
                assert not ids, "a message was shown while the inbox failed"
                codes.append(code)
                return code == "inbox_unavailable"

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while not await refused():
                assert loop.time() < deadline, f"the inbox tool never said so: {codes}"
                await asyncio.sleep(0.2)
            faulted = await asyncio.to_thread(_names_faulted, env, ["mw"])
            assert faulted, await asyncio.to_thread(_warnings, env)
            # Tools that do not need the inbox keep working.
            out = await worker.data("send", to="mate", message="still here")
            assert out["outcome"] in ACKED, out
            fault.off()
            cleared = loop.time()

            seen: Counter[str] = Counter()
            deadline = loop.time() + RECOVERY_S
            while not set(sent) <= set(seen):
                assert loop.time() < deadline, f"missing {set(sent) - set(seen)}: {codes}"
                ids, code = await _inbox_ids(worker)
                seen.update(ids)
                codes.append(code)
                await asyncio.sleep(0.2)
            print(
                f"inbox fault ({fault.kind}): the MCP inbox tool showed all {PER_NAME} messages "
                f"{loop.time() - cleared:.1f} s after it cleared"
            )
            for _ in range(5):  # a late second copy would show in the next calls
                seen.update((await _inbox_ids(worker))[0])
            assert all(seen[m] == 1 for m in sent), seen
            assert first.id not in seen
