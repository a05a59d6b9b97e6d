"""systemd's notify protocol (sd_notify(3)), the few lines of it the relay needs.

A unit of ``Type=notify`` gives the service ``NOTIFY_SOCKET`` (a Unix datagram socket; a
leading ``@`` names one in the abstract namespace) and, with ``WatchdogSec=``,
``WATCHDOG_USEC`` (and ``WATCHDOG_PID``, the process meant). The relay sends ``READY=1`` once it
can deliver, ``WATCHDOG=1`` from its event loop at half the watchdog interval (so a blocked
loop stops the pings and systemd restarts the relay), ``STATUS=`` lines `systemctl status`
shows, and ``STOPPING=1`` on shutdown (docs/operations.md, "Under systemd").
Without ``NOTIFY_SOCKET`` every call does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping, MutableMapping
from typing import Final

log = logging.getLogger(__name__)

NOTIFY_SOCKET: Final = "NOTIFY_SOCKET"
WATCHDOG_USEC: Final = "WATCHDOG_USEC"
WATCHDOG_PID: Final = "WATCHDOG_PID"


def watchdog_interval(env: Mapping[str, str], pid: int) -> float | None:
    """Seconds between pings (half the watchdog timeout), or None: no watchdog for ``pid``."""
    owner = env.get(WATCHDOG_PID)
    if owner and owner != str(pid):
        return None
    try:
        usec = int(env.get(WATCHDOG_USEC, ""))
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None


class Notifier:
    """Sends notify datagrams to systemd (or whoever bound ``NOTIFY_SOCKET``)."""

    def __init__(self, env: MutableMapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        target = env.get(NOTIFY_SOCKET, "")
        self.watchdog_s = watchdog_interval(env, os.getpid())
        # Not handed on: the broker the relay may start is not the service's main process.
        for name in (NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID):
            env.pop(name, None)
        self._address: str | bytes | None = None
        self._sock: socket.socket | None = None
        if target.startswith("@"):
            self._address = b"\0" + target[1:].encode()
        elif target.startswith("/"):
            self._address = target
        if self._address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            # Never blocks the loop: a listener whose queue is full loses a datagram instead.
            self._sock.setblocking(False)
        self._warned = False
        self._status: str | None = None

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *fields: str) -> None:
        if self._sock is None or self._address is None:
            return
        data = "\n".join(f.replace("\n", " ") for f in fields).encode()
        try:
            self._sock.sendto(data, self._address)
        except BlockingIOError:
            return  # the next ping or line is sent anew
        except OSError as exc:
            if not self._warned:  # said once: a gone manager would fill the log otherwise
                self._warned = True
                log.warning("could not notify systemd: %s", exc.strerror)

    def status(self, text: str) -> None:
        """A ``STATUS=`` line for `systemctl status`, sent when it changed."""
        if text != self._status:
            self._status = text
            self.send(f"STATUS={text}")

    def ready(self, text: str) -> None:
        self._status = text
        self.send("READY=1", f"STATUS={text}")

    def stopping(self, text: str = "stopping") -> None:
        self._status = text
        self.send("STOPPING=1", f"STATUS={text}")

    async def feed_watchdog(self) -> None:
        """Ping from the calling event loop for as long as it runs: a loop that blocks stops
        the pings, and systemd takes the relay for hung."""
        interval = self.watchdog_s
        if interval is None or not self.enabled:
            return
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(interval)

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
