"""The relay's Prometheus metrics (docs/operations.md, "Monitoring").

Counters and the store's latency histogram are prometheus-client's own, in a registry of the
relay's; the relay's state (lease, generation, its LISTEN, the broker link, the
other hosts' leases, the mail waiting for this host) is read at scrape time from what the
relay already holds, so a scrape runs no statement. The mail waiting and this host's
reservations are read from the store at every heartbeat (``heartbeat_s``, a grouped statement
each) inside the heartbeat's transaction (``relay/chores.py``: no commit of their own), only
while the metrics are served.
Labels take bounded values only: an outcome, a code, a store operation's name (from the
code), a host id; never a message id, a session or free text. Served by prometheus-client's
own HTTP server on a thread of its own, so a scrape never waits on the relay's event loop.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from crossintercom.errors import Code, ConfigError, CrossintercomError
from crossintercom.models import Outcome, Receipt
from crossintercom.protocol import CountsReport
from crossintercom.reservations import MODES
from crossintercom.storage import Ack, QueuedMail

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

DEFAULT_ADDRESS: Final = "127.0.0.1"
# Store operations take from a millisecond (a pooled read) to the driver's deadline.
_LATENCY_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# What an inbound row's ack says, as a label: delivered to a session, queued on this host for
# one (in its custody), or refused.
# Plain strings, looked up once: an enum member's ``.value`` costs a property call per row.
_DELIVERED = Outcome.DELIVERED.value
_QUEUED = Outcome.QUEUED.value
_REFUSED = Outcome.REFUSED.value
_HOST_QUEUED = Code.HOST_QUEUED.value
HANDED_IN = (_DELIVERED, _QUEUED, _REFUSED)


def parse_address(text: str) -> tuple[str, int]:
    """``ADDR:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` (loopback); a ConfigError otherwise."""
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host, port = "", text.strip()
    host = host.strip("[]") or DEFAULT_ADDRESS
    try:
        number = int(port)
        if not 0 < number < 65536:
            raise ValueError(port)
        if host != "localhost":
            ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(
            f"invalid metrics address {text!r}: use ADDR:PORT, e.g. 127.0.0.1:9464"
        ) from None
    return host, number


def package_version() -> str:
    try:
        return version("crossintercom")
    except PackageNotFoundError:
        return "unknown"


@dataclass
class RelayState:
    """What the scrape reads of the relay: plain values and callables, set by the relay."""

    host: str = ""
    backend: str = ""
    generation: int = 0
    # When the relay's last heartbeat committed (monotonic), None before the first.
    beat_at: float | None = None
    fenced: bool = False
    listener_up: Callable[[], bool] = lambda: False
    listener_reconnects: Callable[[], int] = lambda: 0
    broker_up: Callable[[], bool] = lambda: False
    broker_reconnects: Callable[[], int] = lambda: 0
    # The other hosts' leases: host id -> alive.
    peers: Callable[[], dict[str, bool]] = dict
    queued: QueuedMail | None = None
    # This host's live reservations by mode, read with the queued mail (None before).
    reserved: dict[str, int] | None = None
    # Read from the broker's status with the queued mail (None before, or while unreachable).
    held: int | None = None
    dead_letters: int | None = None


class _StateCollector(Collector):
    def __init__(self, state: RelayState, lease_s: float) -> None:
        self.state = state
        self.lease_s = lease_s

    def collect(self) -> Iterable[Metric]:
        st = self.state
        info = GaugeMetricFamily(
            "crossintercom_relay_info",
            "The relay: its host id, crossintercom version and store backend (always 1)",
            labels=["host", "version", "backend"],
        )
        info.add_metric([st.host, package_version(), st.backend], 1)
        yield info
        yield GaugeMetricFamily(
            "crossintercom_relay_generation",
            "The fencing generation this relay took at start",
            value=st.generation,
        )
        beat = st.beat_at
        held = not st.fenced and beat is not None and time.monotonic() - beat < self.lease_s
        yield GaugeMetricFamily(
            "crossintercom_relay_lease_held",
            "1 while this relay holds its host's lease: not fenced out, and its heartbeat "
            "committed within the lease",
            value=int(held),
        )
        yield GaugeMetricFamily(
            "crossintercom_relay_heartbeat_age_seconds",
            "Seconds since this relay's heartbeat last committed (by its own monotonic clock)",
            value=time.monotonic() - beat if beat is not None else float("nan"),
        )
        yield GaugeMetricFamily(
            "crossintercom_listener_up",
            "1 while the store's wake-up channel (PostgreSQL LISTEN, SQLite doorbells) is set up",
            value=int(st.listener_up()),
        )
        yield CounterMetricFamily(
            "crossintercom_listener_reconnects",
            "Times the wake-up channel was set up again after it was lost",
            value=st.listener_reconnects(),
        )
        yield GaugeMetricFamily(
            "crossintercom_broker_link_up",
            "1 while the relay is connected to this host's broker",
            value=int(st.broker_up()),
        )
        yield CounterMetricFamily(
            "crossintercom_broker_link_reconnects",
            "Times the relay connected to the broker again after the link was lost",
            value=st.broker_reconnects(),
        )
        peers = GaugeMetricFamily(
            "crossintercom_host_up",
            "Each other host of the store: 1 while its heartbeat moves, 0 once its lease lapsed",
            labels=["host"],
        )
        for host, alive in sorted(st.peers().items()):
            peers.add_metric([host], int(alive))
        yield peers
        queued = st.queued
        if queued is not None:
            yield GaugeMetricFamily(
                "crossintercom_queued_messages",
                "Deliveries waiting in the store for this host (read at every heartbeat)",
                value=queued.count,
            )
            age = queued.oldest_age_s if queued.count else 0.0
            yield GaugeMetricFamily(
                "crossintercom_queued_oldest_age_seconds",
                "Age of the oldest delivery waiting in the store for this host (0 when none)",
                value=age if age is not None else float("nan"),
            )
        if st.reserved is not None:
            reserved = GaugeMetricFamily(
                "crossintercom_reservations",
                "Live path reservations this host's sessions hold, by mode (read from the store "
                "at every heartbeat)",
                labels=["mode"],
            )
            for mode in MODES:
                reserved.add_metric([mode], st.reserved.get(mode, 0))
            yield reserved
        if st.held is not None:
            yield GaugeMetricFamily(
                "crossintercom_held_messages",
                "Messages held by an inbound policy of this host's sessions, waiting for the "
                "session to let them through or refuse them (read at every heartbeat)",
                value=st.held,
            )
        if st.dead_letters is not None:
            yield GaugeMetricFamily(
                "crossintercom_dead_letters",
                "Mail this host's sessions sent that was refused or expired and is not resent, "
                "kept for the retention (read at every heartbeat)",
                value=st.dead_letters,
            )


class RelayMetrics:
    """The relay's counters and state, in a registry of its own."""

    def __init__(self, lease_s: float = 15.0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.state = RelayState()
        self.registry.register(_StateCollector(self.state, lease_s))
        r = self.registry
        self._forwarded = Counter(
            "crossintercom_messages_forwarded",
            "Messages this relay forwarded to other hosts, per recipient, by the outcome told "
            "to the sender",
            ["outcome"],
            registry=r,
        )
        self._forwarded_by = {o: self._forwarded.labels(o.value) for o in Outcome}
        self._handed_in = Counter(
            "crossintercom_messages_handed_in",
            "Deliveries from other hosts this relay finished, by how: delivered to a session, "
            "queued in this host's custody, or refused",
            ["outcome"],
            registry=r,
        )
        self._handed_in_by = {o: self._handed_in.labels(o) for o in HANDED_IN}
        self._refused = Counter(
            "crossintercom_rows_refused",
            "Inbound rows refused (quarantined) because they did not pass the relay's screen, "
            "by code",
            ["code"],
            registry=r,
        )
        self._store_latency = Histogram(
            "crossintercom_store_operation_duration_seconds",
            "Store operations (one transaction or statement each, retries included) and their "
            "time, by operation",
            ["operation"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._store_errors = Counter(
            "crossintercom_store_errors",
            "Store operations that failed, by code",
            ["code"],
            registry=r,
        )
        self._in_doubt = Counter(
            "crossintercom_store_in_doubt_commits",
            "Commits whose fate was unknown (the connection was lost during COMMIT), resolved "
            "by reading or writing again",
            registry=r,
        )
        self._latency_of: dict[str, Histogram] = {}
        self._server: WSGIServer | None = None
        self.serving = False

    # --- what the relay tells -------------------------------------------------------------------

    def forwarded(self, receipts: Sequence[Receipt]) -> None:
        for receipt in receipts:
            self._forwarded_by[receipt.outcome].inc()

    def handed_in(self, acks: Sequence[Ack], refused_by_screen: Iterable[str] = ()) -> None:
        """One recipient's acks of a batch; ``refused_by_screen``: the codes of those the
        screen refused. One increment per outcome, not per row."""
        refused = queued = 0
        for ack in acks:
            if ack.outcome == _REFUSED:
                refused += 1
            elif ack.code == _HOST_QUEUED:
                queued += 1
        for outcome, n in (
            (_DELIVERED, len(acks) - refused - queued),
            (_QUEUED, queued),
            (_REFUSED, refused),
        ):
            if n:
                self._handed_in_by[outcome].inc(n)
        for code in refused_by_screen:
            self._refused.labels(code).inc()

    def store_operation(self, name: str, seconds: float, error: CrossintercomError | None) -> None:
        """The store's observer (``MailboxStore.observe``)."""
        child = self._latency_of.get(name)
        if child is None:
            child = self._latency_of[name] = self._store_latency.labels(name)
        child.observe(seconds)
        if error is not None:
            self._store_errors.labels(str(error.code)).inc()
            if error.code == Code.STORE_IN_DOUBT:
                self._in_doubt.inc()

    def reserved(self, by_mode: dict[str, int]) -> None:
        self.state.reserved = by_mode

    def broker_counts(self, counts: CountsReport) -> None:
        self.state.held = counts.held
        self.state.dead_letters = counts.dead_letters

    def queued(self, found: Sequence[QueuedMail]) -> None:
        st = self.state
        st.queued = next((m for m in found if m.host_id == st.host), QueuedMail(st.host, 0, 0.0))

    # --- serving ----------------------------------------------------------------------------------

    def serve(self, address: str) -> tuple[str, int]:
        """Serve ``/metrics`` on ``address`` (``parse_address``) from a thread of its own; the
        address bound (a port 0 is chosen by the system)."""
        host, port = parse_address(address)
        try:
            server, _thread = start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {address}: {exc.strerror}") from None
        self._server = server
        self.serving = True
        bound = server.server_address
        return str(bound[0]), int(bound[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.serving = False
