"""A harness joined through a gateway with nothing of crossintercom beside it: the gateway
(TLS, a test CA, MCP over HTTP) runs on the peer's host, `setup HARNESS --gateway` writes the
harness's entries there, and the sandbox's environment holds only the token and the CA, no
crossintercom setting (docs/agents.md#mcp-over-http)."""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import CLI, cli_json, run_cli, wait_for
from tests.harnesses import kits
from tests.harnesses.agentmail import WORKER, Hostile, joins, peer_send, shown_only_framed
from tests.harnesses.isolation import HarnessEnv
from tests.harnesses.mockmodel import MockModel
from tests.pgtls import make_certificates


@dataclasses.dataclass
class Joined:
    host: kits.Kit  # the gateway's host: the peer's commands run here
    sandbox: kits.Kit  # the harness, with only the token and the CA


@contextlib.contextmanager
def through_gateway(kit: kits.Kit, harness: str, henv: HarnessEnv) -> Iterator[Joined]:
    """The gateway up, WORKER granted and `setup HARNESS --gateway` written into kit.cwd."""
    certs = Path(tempfile.mkdtemp(prefix="gwc-", dir=henv.root))
    ca = make_certificates(certs).ca
    ready = certs / "ready"
    log = certs / "gateway.log"  # a file: an unread pipe fills and stops the gateway
    with log.open("w") as err:
        gateway = subprocess.Popen(
            [
                *CLI,
                *("gateway", "serve", "--listen", "127.0.0.1:0", "--mcp-listen", "127.0.0.1:0"),
                *("--cert", str(certs / "server.crt"), "--key", str(certs / "server.key")),
                *("--ready-file", str(ready)),
            ],
            env=kit.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_for(lambda: len(ready.read_text().split()) == 2 if ready.exists() else False, 30,
                 "the gateway to listen")  # fmt: skip
        mcp_port = int(ready.read_text().split()[1])
        token = cli_json(kit.env, "gateway", "grant", "--as", WORKER)["token"]
        url = f"https://localhost:{mcp_port}"
        out = run_cli(
            kit.env,
            *("setup", harness, "--as", WORKER, "--dir", str(kit.cwd)),
            *("--gateway", url, "--gateway-ca", str(ca)),
        )
        assert out.returncode == 0, out.stderr
        joins(kit)
        for written in kit.cwd.rglob("*"):
            if written.is_file() and "node_modules" not in written.parts:
                assert token not in written.read_text(errors="replace"), written
        env = {k: v for k, v in kit.env.items() if not k.startswith("CROSSINTERCOM_")}
        env |= {"CROSSINTERCOM_TOKEN": token, "NODE_EXTRA_CA_CERTS": str(ca)}
        yield Joined(kit, dataclasses.replace(kit, env=env))
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
        assert "cig_" not in log.read_text()  # no token in the gateway's log


def woken_by_hostile_mail(joined: Joined, mock: MockModel, timeout: float) -> Hostile:
    """The peer sends hostile mail to the idle worker; the model request it wakes (one that
    offers tools: a turn, not a title) shows it framed, and no request shows it raw."""
    hostile = Hostile()
    seen = len(mock.requests)
    peer_send(joined.host, hostile.text)
    woken = mock.wait_for(
        lambda r: hostile.before in r.all_text() and bool(r.tool_names), timeout=timeout, after=seen
    )
    assert shown_only_framed(woken, hostile), woken.all_text()[-2000:]
    for req in mock.model_requests():
        assert hostile.fake_end not in req.all_text()
    return hostile


def shown_on_the_gateway(joined: Joined, hostile: Hostile) -> None:
    """The wake confirmed its hand-over: the gateway's session holds the mail as shown, not
    unseen for the next poll."""
    unseen = run_cli(joined.host.env, "inbox", "--as", WORKER, "--unseen", "--json")
    assert unseen.returncode == 0 and hostile.before not in unseen.stdout, unseen.stdout
