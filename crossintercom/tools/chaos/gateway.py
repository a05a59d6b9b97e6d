"""The ``gateway_kill`` fault of `crossintercom chaos`: one host lends its broker through a
gateway (`crossintercom gateway serve`, plain HTTP on loopback as behind a TLS proxy on the same
machine), and one of its senders is a remote session sending through it. The fault SIGKILLs the
gateway mid-traffic and restarts it on the same port a moment later: the remote sender is told
``unknown`` or ``not_sent`` honestly, and the run's lost and duplicated counts stay 0
(docs/agents.md#through-a-gateway)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

from crossintercom.client import AsyncClient, Identity, wait_until
from crossintercom.config import ENV_GATEWAY, ENV_GATEWAY_TOKEN_FILE, load_settings
from crossintercom.errors import CrossintercomError
from crossintercom.tools.harness import CLI, SimHost

# The remote session's name on the gateway's host.
REMOTE = "remote"
LISTEN_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ChaosGateway:
    """A gateway process of ``host``'s, always on one port (a restart binds it again)."""

    def __init__(self, host: SimHost) -> None:
        self.host = host
        self.port = _free_port()
        self.dir = host.home.parent / f"{host.home.name}-gateway"
        self.dir.mkdir(mode=0o700)
        self.token_file = self.dir / "token"
        self.proc: subprocess.Popen[bytes] | None = None
        self._runs = 0

    def grant(self) -> None:
        """A token acting as ``REMOTE``, in a file of its own as the remote machine keeps it."""
        out = subprocess.run(
            [*CLI, "gateway", "grant", "--as", REMOTE, "--json"],
            env=self.host.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            raise CrossintercomError(f"gateway grant failed: {out.stderr.strip()[-500:]}")
        self.token_file.write_text(json.loads(out.stdout)["token"] + "\n")
        self.token_file.chmod(0o600)

    def start(self, *, wait: bool = True) -> None:
        self._runs += 1
        ready = self.dir / f"ready-{self._runs}"
        log = self.dir / f"gateway-{self._runs}.log"
        listen = f"127.0.0.1:{self.port}"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [*CLI, "gateway", "serve", "--listen", listen, "--ready-file", str(ready)],
                env=self.host.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        if wait and not wait_until(lambda: _listening(ready, self.proc), LISTEN_S, 0.05):
            raise CrossintercomError(f"the gateway did not listen: {log.read_text()[-2000:]}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: its connections end unanswered, as a crashed machine's would."""
        if self.proc is not None and self.alive():
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        if not self.alive():
            self.start(wait=False)

    def stop(self) -> None:
        if self.proc is not None and self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self) -> AsyncClient:
        """The remote session: no broker of its own, only the gateway's port."""
        env = {
            **self.host.env,
            ENV_GATEWAY: f"http://127.0.0.1:{self.port}",
            ENV_GATEWAY_TOKEN_FILE: str(self.token_file),
        }
        settings = load_settings(env)
        return AsyncClient(settings, Identity.named(settings, REMOTE, cwd=None))


def _listening(ready: Path, proc: subprocess.Popen[bytes] | None) -> bool:
    if proc is not None and proc.poll() is not None:
        raise CrossintercomError(f"the gateway exited {proc.returncode}")
    return ready.exists() and ready.read_text().endswith("\n")
