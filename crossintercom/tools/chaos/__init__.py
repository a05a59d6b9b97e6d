"""`crossintercom chaos`: several simulated hosts exchange mail while faults are injected.

Each host is what a machine runs (its own runtime dir, host id, broker and relay process, see
``harness.SimHost``) plus a durable listener process (`crossintercom listen --as sink`). A sender
client per host (Python API, in this process) sends continuously to the sinks of the other hosts
and, now and then, to its own host's sink. At seeded random moments one of these faults hits one
host (``faults``; in rounds of every kind once):

* ``relay_kill``: SIGKILL of the relay, restarted a moment later;
* ``relay_pause``: SIGSTOP of the relay (a frozen process, a paused VM), SIGCONT a moment later;
* ``broker_kill``: SIGKILL of the broker; clients and the relay reconnect and respawn it;
* ``listener_kill``: SIGKILL of the listener, restarted a moment later (it resumes its mail);
* ``pg_terminate`` (PostgreSQL only): ``pg_terminate_backend`` of every other connection to the
  store's database, that is the relays' connections (their statements and LISTEN);
* ``pg_blackhole`` (PostgreSQL only): the relays reach the store through a TCP proxy of the run's
  own (``proxy.TcpProxy``); it holds all traffic both ways, released a moment later;
* ``pg_cut`` (PostgreSQL only): the proxy resets every relay connection at once;
* ``pg_restart`` (only with ``own_postgres``: a throwaway cluster the run started itself, never a
  server anybody else uses): a fast restart of the PostgreSQL server;
* ``pg_failover`` (only with ``own_postgres``, asked for by name: the store is then a primary +
  streaming standby of the run's own, synchronous unless asked otherwise; ``failover``): the
  standby is promoted under traffic and the old primary stopped as by a crash, then brought
  back as a standby; its log entry says how long until mail flowed again;
* ``hostile_rows``: a rogue host writes malformed or forged rows straight into the store,
  addressed to a host's sink; each must be refused (quarantined) with its reason, once, and
  never reach an inbox;
* ``relay_takeover``: the relay is frozen past its (short) lease while a relay for the same host
  id takes over from another machine and delivers; woken, the frozen one must exit fenced
  without writing anything (``takeover``); the host stays on the new machine;
* ``coord_flood``: a session of the host floods its broker with reserves of a hundred globs,
  unreserves and inbound policy changes for a moment (``coordflood``); it meets its quota and
  its rate, and everyone's mail flows on;
* ``gateway_kill``: host 0 lends its broker through a gateway of the run's, and one of its
  senders is a remote session sending through it (``gateway``); the gateway is SIGKILLed and
  restarted on its port a moment later; that sender is told ``unknown`` or ``not_sent``
  honestly, and what it was told was taken arrives once;
* ``inbox_readonly`` and ``disk_full`` (root only, ``disk``): the sink's inbox files made
  immutable, or the host's runtime dir (a small tmpfs of the run's) filled up, released a moment
  later; what was acknowledged must wait and arrive after.

At the end everything is restarted, the listeners drain (with a deadline), and every sink's inbox
is compared with what the senders were told (``report``):

* lost: an acknowledged (``delivered`` / ``queued``) message missing from its recipient's inbox;
* duplicated: a message id, or a sequence number carried in the text, seen twice in one inbox
  (client retries reuse the id, so the same sequence number under two ids is a duplicate too);
* phantom (reported, not a failure of this run): a ``not_sent`` message found in an inbox;
* quarantined: an injected hostile row the receiving relay refused;
* unfenced: a takeover whose woken relay did not exit fenced.

``by_fault`` splits these per fault kind: a message counts under the last fault injected before
it was sent (``none`` before the first).
"""

from crossintercom.tools.chaos.faults import FAULT_KINDS, fault_kinds
from crossintercom.tools.chaos.report import ChaosReport, render
from crossintercom.tools.chaos.run import run_chaos
from crossintercom.tools.chaos.state import read_sink

__all__ = ["FAULT_KINDS", "ChaosReport", "fault_kinds", "read_sink", "render", "run_chaos"]
