"""A session in a sandbox joins through the gateway on host A (TLS, a test CA) and talks with a
session on host B as a local session of A would; tokens bind it to its name, and every way
around that is refused with its own code (docs/operations.md#gateway)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from websockets.exceptions import InvalidStatus

from crossintercom import protocol as p
from crossintercom.client import AsyncClient, Client, Identity
from crossintercom.config import load_settings
from crossintercom.gateway.server import HEAD_S
from crossintercom.models import SendResult, durable_session_id
from tests.agents.conftest import mcp_server, spawn, until
from tests.conftest import run_cli, sessions, wait_for
from tests.gateway.conftest import (
    Gateway,
    hostile,
    open_frames,
    sandbox_json,
    start_gateway,
)
from tests.relay.conftest import Host


def code_of(out: dict[str, Any]) -> str:
    """A refused send's code, as an outcome or as the command's error."""
    return str(out["code"] if "code" in out else out["error"]["code"])


def _on_a(a: Host, name: str) -> bool:
    return any(s["name"] == name and s["online"] for s in sessions(a.home, quiet=True) or ())


def test_a_sandbox_sends_is_woken_and_resumes_in_order(
    gateway: tuple[Gateway, Host, Host],
) -> None:
    gw, a, b = gateway
    env = gw.sandbox(gw.grant("worker"))
    lead = b.listen("lead")

    rc, sent = sandbox_json(
        env, "send", "--as", "worker", "--to", "lead@B", "hello from the sandbox"
    )
    assert rc == 0 and sent["outcome"] == "delivered", sent
    got = lead.next_message(30)
    assert (got["id"], got["message"]) == (sent["id"], "hello from the sandbox")
    assert got["from"]["name"] == "worker" and got["from"]["host"] == "A", got
    # Nothing of A's in the sandbox: no broker socket, no store; only its own inbox.
    home = Path(env["CROSSINTERCOM_HOME"])
    assert not (home / "broker.sock").exists()

    # Mail sent while the sandbox was away waits on A, and arrives once, in order.
    ids = []
    for i in range(3):
        out = b.cli_json("send", "--as", "lead", "--to", "worker@A", f"away {i}")
        assert out["outcome"] in ("queued", "delivered"), out
        ids.append(out["id"])
    rc, shown = sandbox_json(env, "inbox", "--as", "worker", "--unseen")
    assert rc == 0, shown
    assert [m["id"] for m in shown] == ids, shown
    rc, again = sandbox_json(env, "inbox", "--as", "worker", "--unseen")
    assert rc == 0 and again == [], again

    # A wake hook waiting in the sandbox is woken by mail from B.
    hook = spawn(env, "wait", "--as", "worker", "--format", "text", "--timeout", "60")
    try:
        wait_for(lambda: _on_a(a, "worker"), 30, "the sandbox's waiter to hold worker on A")
        woke = b.cli_json("send", "--as", "lead", "--to", "worker@A", "wake up")
        out, err = hook.communicate(timeout=60)
    finally:
        if hook.poll() is None:
            hook.kill()
            hook.communicate()
    assert "wake up" in out and woke["id"] in out, (out, err)

    # An ask from B, answered in the sandbox.
    asking = spawn(
        b.env, "ask", "--as", "lead", "--to", "worker@A", "ready?", "--timeout", "60", "--json"
    )
    try:

        def pending() -> list[dict[str, str]]:
            rc, asks = sandbox_json(env, "pending", "--as", "worker")
            assert rc == 0, asks
            return list(asks)

        (ask,) = wait_for(pending, 30, "the ask to reach the sandbox")
        rc, replied = sandbox_json(env, "reply", "--as", "worker", "yes", "--reply-to", ask["id"])
        assert rc == 0 and replied["outcome"] == "delivered", replied
        out, err = asking.communicate(timeout=60)
    finally:
        if asking.poll() is None:
            asking.kill()
            asking.communicate()
    answer = json.loads(out)
    assert answer["reply"]["message"] == "yes", (out, err)
    lead.stop()


def test_the_python_client_through_the_gateway(gateway: tuple[Gateway, Host, Host]) -> None:
    gw, _, b = gateway
    env = gw.sandbox(gw.grant("pyworker"))
    lead = b.listen("lead")
    asyncio.run(_python_client(env, b))
    got = lead.next_message(30)
    assert got["message"] == "from python"
    settings = load_settings(env)
    with Client(settings, Identity.named(settings, "pyworker", cwd=None)) as client:
        assert client.send("lead@B", "from the blocking client").outcome == "delivered"
    assert lead.next_message(30)["message"] == "from the blocking client"
    lead.stop()


async def _python_client(env: dict[str, str], b: Host) -> None:
    settings = load_settings(env)
    async with AsyncClient(settings, Identity.named(settings, "pyworker", cwd=None)) as client:
        result = await client.send("lead@B", "from python")
        assert result.outcome == "delivered", result
        # The host's status, as a token holder may read it: the relay link and counts only.
        status = await client.status()
        assert status.relay.connected and status.host_id == "A"
        assert (status.pid, status.relay.store, status.warnings) == (0, None, [])
        assert set(status.inbound) <= {"pyworker"}
        sent = await asyncio.to_thread(
            b.cli_json, "send", "--as", "lead", "--to", "pyworker@A", "to python"
        )
        got = await client.next_incoming(30)
        while got is not None and got.message is None:  # lead's receipt for "from python"
            got = await client.next_incoming(30)
        assert got is not None and got.message is not None, got
        assert (got.message.id, got.message.text) == (sent["id"], "to python")


def test_a_token_acts_as_its_name_and_nothing_else(gateway: tuple[Gateway, Host, Host]) -> None:
    gw, a, b = gateway
    b.listen("lead")
    token_file = gw.grant("worker")
    env = gw.sandbox(token_file)

    # Acting as another name: refused, nothing sent.
    rc, other = sandbox_json(env, "send", "--as", "boss", "--to", "lead@B", "I am the boss")
    assert rc != 0 and code_of(other) == "gateway_wrong_name", other

    # The gateway's CA unknown to the client: refused before any token is sent.
    rc, untrusted = sandbox_json(
        gw.sandbox(token_file, CROSSINTERCOM_GATEWAY_CA=str(gw.certs.wrong_ca)),
        *("send", "--as", "worker", "--to", "lead@B", "hi"),
    )
    assert rc != 0 and code_of(untrusted) == "gateway_untrusted", untrusted

    # A hostile client speaking the frames itself: a relay's frame is refused, and so is a
    # registration as another session.
    token = Path(token_file).read_text().strip()
    roster = p.encode(p.RemoteRoster(sessions=[]))
    status, answer = hostile(gw.port, token, roster, ca=gw.certs.ca)
    assert status == 101, (status, answer)
    assert b'"code":"gateway_forbidden_frame"' in answer, answer
    register = p.Register(
        request_id=1,
        protocol=p.PROTOCOL_VERSION,
        session=p.SessionBody(id=durable_session_id("A", "lead"), name="worker", durable=True),
    )
    status, answer = hostile(gw.port, token, p.encode(register), ca=gw.certs.ca)
    assert status == 101 and b'"code":"gateway_wrong_name"' in answer, (status, answer)

    # What is not a frame ends the connection: a text message, a message larger than a frame
    # may be (before it is held whole).
    assert hostile(gw.port, token, "not a frame", ca=gw.certs.ca) == (101, b"")
    huge = p.HEADER.pack(9 * 1024 * 1024) + b"x" * (9 * 1024 * 1024)
    assert hostile(gw.port, token, huge, ca=gw.certs.ca) == (101, b"")

    # At most 16 connections at once on one grant.
    with contextlib.ExitStack() as held:
        for _ in range(16):
            held.enter_context(open_frames(gw.port, token, ca=gw.certs.ca))
        status, answer = hostile(gw.port, token, ca=gw.certs.ca)
        assert status == 429 and b"over_capacity" in answer, (status, answer)

    def admitted() -> bool:
        try:
            with open_frames(gw.port, token, ca=gw.certs.ca):
                pass
        except InvalidStatus:
            return False
        return True

    wait_for(admitted, 30, "a connection of the grant's once the others ended")

    # No token, an unknown one: refused at the door.
    for bad, code in (("", b"gateway_no_token"), ("cig_nothing", b"gateway_token_unknown")):
        status, answer = hostile(gw.port, bad, ca=gw.certs.ca)
        assert status == 401 and code in answer, (status, answer)

    # Revoked: refused from then on, and a connection it holds ends.
    holder = spawn(env, "listen", "--as", "worker", "--json")
    try:
        wait_for(lambda: _on_a(a, "worker"), 30, "the sandbox's listener on A")
        revoked = a.cli_json("gateway", "revoke", "worker")
        assert [g["name"] for g in revoked] == ["worker"], revoked
        wait_for(lambda: not _on_a(a, "worker"), 30, "the revoked grant's connection to end")
    finally:
        holder.kill()
        holder.communicate()
    rc, after = sandbox_json(env, "send", "--as", "worker", "--to", "lead@B", "still me?")
    assert rc != 0 and code_of(after) == "gateway_token_revoked", after
    listed = run_cli(a.env, "gateway", "list", "--json")
    assert listed.returncode == 0 and "revoked" in listed.stdout
    for token in gw.tokens.values():  # never shown again, nor kept in the clear
        assert token not in listed.stdout
        assert token not in (a.home / "gateway-tokens.json").read_text()
    assert (a.home / "gateway-tokens.json").stat().st_mode & 0o777 == 0o600


def test_plain_http_is_refused_from_another_address(gateway: tuple[Gateway, Host, Host]) -> None:
    gw, a, _ = gateway
    token_file = gw.grant("worker")
    token = Path(token_file).read_text().strip()
    address = _non_loopback_address()
    plain = start_gateway(a, gw.root, gw.certs, f"{address}:0", tls=False)
    try:
        status, answer = hostile(plain.port, token, address=address)
        assert status == 403 and b"gateway_plain_http" in answer, (status, answer)
        # A client that connects and sends no request is dropped once its head is late.
        with socket.create_connection((address, plain.port), timeout=HEAD_S + 15) as silent:
            started = time.monotonic()
            assert silent.recv(1024) == b""
            assert time.monotonic() - started < HEAD_S + 15
        # The client does not even send the token over plain HTTP to another machine.
        env = gw.sandbox(token_file, CROSSINTERCOM_GATEWAY=f"http://{address}:{plain.port}")
        rc, out = sandbox_json(env, "send", "--as", "worker", "--to", "lead@B", "hi")
        assert rc != 0 and code_of(out) == "gateway_plain_http", out
    finally:
        log = plain.stop()
    assert token not in log


def _non_loopback_address() -> str:
    """An address of this machine that is not loopback (a connection from it is not local)."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True)
    found = [a for a in out.stdout.split() if ":" not in a and not a.startswith("127.")]
    assert found, "this machine has no non-loopback IPv4 address"
    return found[0]


def test_the_mcp_server_in_the_sandbox_uses_the_gateway(
    gateway: tuple[Gateway, Host, Host],
) -> None:
    gw, a, b = gateway
    env = gw.sandbox(gw.grant("worker"))
    lead = b.listen("lead")
    asyncio.run(_mcp(env, a, b))
    assert lead.next_message(30)["message"] == "over MCP"
    lead.stop()


async def _mcp(env: dict[str, str], a: Host, b: Host) -> None:
    async with mcp_server(env, "worker") as (worker, _):
        await until(lambda: _on_a(a, "worker"), 30, "the sandbox's MCP server on A")
        me = await worker.data("whoami")
        assert (me["name"], me["host"], me["relay_connected"]) == ("worker", "A", True), me
        sent = await worker.data("send", to="lead@B", message="over MCP")
        assert sent["outcome"] == "delivered", sent
        out = await asyncio.to_thread(
            b.cli_json, "send", "--as", "lead", "--to", "worker@A", "to the MCP server"
        )

        async def arrived() -> list[dict[str, Any]]:
            return await worker.mail("inbox")

        got: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not (got := await arrived()):
            assert loop.time() < deadline, "no mail reached the sandbox's MCP server"
            await asyncio.sleep(0.2)
        assert [m["id"] for m in got] == [out["id"]]


def test_a_gateway_killed_and_back_loses_and_repeats_nothing(
    gateway: tuple[Gateway, Host, Host],
) -> None:
    gw, a, b = gateway
    env = gw.sandbox(gw.grant("worker"))
    rc, first = sandbox_json(env, "send", "--as", "worker", "--to", "worker@A", "hello me")
    assert rc == 0, first
    gw.proc.kill()
    gw.proc.communicate()
    # Nothing reached a broker: said so (no outcome to doubt), safe to send again.
    rc, down = sandbox_json(env, "send", "--as", "worker", "--to", "lead@B", "while down")
    assert rc != 0 and code_of(down) == "broker_unavailable", down
    assert "gateway" in down["error"]["message"], down
    # Mail for the sandbox meanwhile waits on A.
    ids = [
        b.cli_json("send", "--as", "lead", "--to", "worker@A", f"meanwhile {i}")["id"]
        for i in range(3)
    ]
    back = start_gateway(a, gw.root, gw.certs, f"127.0.0.1:{gw.port}", tls=True)
    gw.proc = back.proc
    rc, shown = sandbox_json(env, "inbox", "--as", "worker", "--unseen")
    assert rc == 0, shown
    assert [m["id"] for m in shown] == [first["id"], *ids], shown
    rc, again = sandbox_json(env, "inbox", "--as", "worker", "--unseen")
    assert rc == 0 and again == [], again


def test_setup_in_the_sandbox_carries_the_gateway_and_no_token(
    gateway: tuple[Gateway, Host, Host],
) -> None:
    gw, _, _ = gateway
    token_file = gw.grant("worker")
    env = gw.sandbox(token_file)
    project = Path(env["HOME"]) / "project"
    out = run_cli(env, "setup", "claude-code", "--as", "worker", "--dir", str(project))
    assert out.returncode == 0, out.stderr
    entry = json.loads((project / ".mcp.json").read_text())["mcpServers"]["crossintercom"]
    assert entry["env"]["CROSSINTERCOM_GATEWAY"] == gw.url
    assert entry["env"]["CROSSINTERCOM_GATEWAY_TOKEN_FILE"] == token_file
    hook = (project / ".claude" / "settings.local.json").read_text()
    assert "CROSSINTERCOM_GATEWAY=" in hook and "wait --as worker" in hook
    token = Path(token_file).read_text().strip()
    for written in project.rglob("*"):
        if written.is_file():
            assert token not in written.read_text(), written


def test_a_gateway_killed_mid_send_is_unknown_and_the_retry_delivers_once(
    gateway: tuple[Gateway, Host, Host],
) -> None:
    gw, a, b = gateway
    env = gw.sandbox(gw.grant("worker"))
    lead = b.listen("lead")
    result = asyncio.run(_killed_mid_send(env, gw))
    # The frame was written to a gateway that died holding it: the client cannot know whether
    # the broker took it, and says so.
    assert result.outcome == "unknown", result
    back = start_gateway(a, gw.root, gw.certs, f"127.0.0.1:{gw.port}", tls=True)
    gw.proc = back.proc
    again = asyncio.run(_resend(env, result.id))
    assert again.outcome == "delivered", again
    got = lead.next_message(30)
    assert (got["id"], got["message"]) == (result.id, "in flight")
    lead.no_message(1.0)
    assert lead.message_ids()[result.id] == 1
    lead.stop()


async def _killed_mid_send(env: dict[str, str], gw: Gateway) -> SendResult:
    settings = load_settings(env)
    async with AsyncClient(settings, Identity.named(settings, "worker", cwd=None)) as client:
        os.kill(gw.proc.pid, signal.SIGSTOP)  # it holds the frame, forwards nothing
        sending = asyncio.create_task(client.send("lead@B", "in flight"))
        await until(lambda: client._conn._requests, 30, "the send to be written")
        os.kill(gw.proc.pid, signal.SIGKILL)
        await asyncio.to_thread(gw.proc.communicate)
        return await sending


async def _resend(env: dict[str, str], message_id: str) -> SendResult:
    """The same message again, by its id, as a program told `unknown` may do."""
    settings = load_settings(env)
    async with AsyncClient(settings, Identity.named(settings, "worker", cwd=None)) as client:
        return await client.send("lead@B", "in flight", message_id=message_id)
