"""A chaos run's counts: what the senders were told against what the inboxes hold."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from crossintercom.tools.chaos.rogue import delivery_reasons
from crossintercom.tools.chaos.state import ACKNOWLEDGED, ChaosState

_SEQ = re.compile(r"\bseq=(\d+)\b")
PER_FAULT = ("sent", "lost", "duplicated", "copies", "phantom", "injected", "quarantined")


@dataclass
class ChaosReport:
    backend: str
    store: str
    hosts: int
    duration_s: float
    seed: int
    date: str
    attempted: int = 0
    acknowledged: int = 0
    delivered: int = 0
    queued: int = 0
    unknown: int = 0
    not_sent: int = 0
    refused: int = 0
    # The outcomes of the messages sent to another host: what the relays' metrics count.
    cross_host: dict[str, int] = field(default_factory=dict)
    # The outcomes of the remote session's messages, sent through the gateway (gateway_kill).
    through_gateway: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    duplicated: int = 0
    duplicated_by_id: int = 0
    phantom: int = 0
    injected: int = 0
    quarantined: int = 0
    # Injected rows not refused by the end (still queued, or delivered), and any in an inbox.
    unquarantined: int = 0
    hostile_in_inboxes: int = 0
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    # Takeovers whose frozen relay, resumed, did not exit fenced or handed mail over still.
    unfenced: int = 0
    # Messages on both machines of a takeover (docs/reliability.md): not duplicates in one
    # inbox, but a host's two machines each saved them.
    takeover_copies: int = 0
    in_inboxes: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    # Fault kinds this machine cannot inject (kind -> why): left out of a default run; asked
    # for by name, they fail the run instead of passing untested.
    unavailable: dict[str, str] = field(default_factory=dict)
    not_run: list[str] = field(default_factory=list)
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    by_fault: dict[str, dict[str, int]] = field(default_factory=dict)
    codes: dict[str, int] = field(default_factory=dict)
    lost_ids: list[str] = field(default_factory=list)
    duplicated_ids: list[str] = field(default_factory=list)
    # pg_failover: of the messages lost, the longest time from being sent to the old
    # primary's stop after it (asynchronous replication's window; None: nothing was lost).
    failover_loss_window_s: float | None = None
    drain_s: float = 0.0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicated == 0
            and self.quarantined == self.injected
            and self.hostile_in_inboxes == 0
            and self.unfenced == 0
            and not self.not_run
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}


def _fault_at(fault_log: list[dict[str, Any]], t: float) -> str:
    """The last fault kind injected at or before ``t`` (``none`` before the first)."""
    kind = "none"
    for entry in fault_log:  # in time order
        if entry["t"] > t:
            break
        kind = entry["fault"]
    return kind


def tally(state: ChaosState, report: ChaosReport) -> None:
    """Fill ``report`` in, once every listener has stopped (the inboxes are final)."""
    sent = state.sent
    outcomes = Counter(s.outcome for s in sent)
    report.attempted = len(sent)
    report.delivered = outcomes["delivered"]
    report.queued = outcomes["queued"]
    report.acknowledged = report.delivered + report.queued
    report.unknown = outcomes["unknown"]
    report.not_sent = outcomes["not_sent"]
    report.refused = outcomes["refused"]
    report.cross_host = dict(Counter(s.outcome for s in sent if s.sender_host != s.recipient_host))
    report.through_gateway = dict(Counter(s.outcome for s in sent if s.via_gateway))
    report.codes = dict(Counter(f"{s.outcome}:{s.code}" for s in sent if s.code is not None))
    inboxes = state.inboxes()
    mine = re.compile(rf"^chaos {re.escape(state.token)} ")
    by_seq = {s.seq: s for s in sent}
    by_id = {s.id: s for s in sent}
    by_fault: dict[str, Counter[str]] = {}

    def count(kind: str, what: str, n: int = 1) -> None:
        by_fault.setdefault(kind, Counter())[what] += n

    for machines in inboxes.values():
        for entries in machines:
            ids = Counter(i for i, _ in entries)
            seqs = Counter(
                int(m.group(1)) for _, t in entries if mine.match(t) and (m := _SEQ.search(t))
            )
            report.in_inboxes += len(entries)
            report.duplicated_by_id += sum(c - 1 for c in ids.values() if c > 1)
            report.duplicated_ids += [i for i, c in ids.items() if c > 1]
            report.duplicated += sum(c - 1 for c in seqs.values() if c > 1)
            for seq, c in seqs.items():
                if c > 1 and seq in by_seq:
                    count(_fault_at(state.fault_log, by_seq[seq].t), "duplicated", c - 1)
        # The same message on two machines of one host id: handed over on the old one just
        # before it froze, its ack lost with the freeze, so the new one handed it over again.
        on_machines = Counter(i for entries in machines for i in {i for i, _ in entries})
        for mid, c in on_machines.items():
            if c > 1:
                report.takeover_copies += c - 1
                if (s := by_id.get(mid)) is not None:
                    count(_fault_at(state.fault_log, s.t), "copies", c - 1)
    report.duplicated = max(report.duplicated, report.duplicated_by_id)
    held = {
        name: {i for entries in machines for i, _ in entries} for name, machines in inboxes.items()
    }
    for s in sent:
        kind = _fault_at(state.fault_log, s.t)
        count(kind, "sent")
        present = s.id in held.get(s.recipient_host, set())
        if s.outcome in ACKNOWLEDGED and not present:
            report.lost += 1
            report.lost_ids.append(s.id)
            count(kind, "lost")
        elif s.outcome == "not_sent" and present:
            report.phantom += 1
            count(kind, "phantom")
    _tally_hostile(state, report, set().union(*held.values()) if held else set())
    if state.injected:
        count("hostile_rows", "injected", report.injected)
        count("hostile_rows", "quarantined", report.quarantined)
    report.failover_loss_window_s = _loss_window(state, report.lost_ids)
    report.by_fault = {kind: {k: c[k] for k in PER_FAULT} for kind, c in sorted(by_fault.items())}
    report.faults = dict(state.faults)
    report.fault_log = state.fault_log
    report.unfenced = sum(
        1
        for e in state.fault_log
        if e["fault"] == "relay_takeover" and (not e["fenced"] or e["stale_handovers"])
    )


def _loss_window(state: ChaosState, lost_ids: list[str]) -> float | None:
    """How long before the old primary stopped the earliest message a pg_failover lost was
    sent."""
    ends = [e["t"] + e["old_stopped_s"] for e in state.fault_log if e["fault"] == "pg_failover"]
    lost = set(lost_ids)
    windows = [
        min(end for end in ends if end >= s.t) - s.t
        for s in state.sent
        if s.id in lost and any(end >= s.t for end in ends)
    ]
    return round(max(windows), 3) if windows else None


def _tally_hostile(state: ChaosState, report: ChaosReport, anywhere: set[str]) -> None:
    states = delivery_reasons(state.store.url, list(state.injected))
    reasons: Counter[str] = Counter()
    for mid in state.injected:
        row_state, reason = states.get(mid, ("missing", None))
        if row_state == "refused":
            report.quarantined += 1
            reasons[str(reason)] += 1
        else:
            report.unquarantined += 1
        if mid in anywhere:
            report.hostile_in_inboxes += 1
    report.injected = len(state.injected)
    report.quarantine_reasons = dict(reasons)


def render(report: ChaosReport) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"crossintercom chaos: {report.backend} ({report.store}), {report.hosts} hosts, "
        f"{report.duration_s:g} s, seed {report.seed}, {report.date}"
    )
    table = Table()
    names = (
        "attempted",
        "acknowledged",
        "delivered",
        "queued",
        "unknown",
        "not_sent",
        "refused",
        "lost",
        "duplicated",
        "takeover_copies",
        "phantom",
        "injected",
        "quarantined",
    )
    table.add_column("count")
    table.add_column("messages", justify="right")
    for name in names:
        table.add_row(name, str(getattr(report, name)))
    console.print(table)
    faults = ", ".join(f"{k} x{v}" for k, v in sorted(report.faults.items())) or "none"
    console.print(f"  faults injected: {faults}")
    for kind, why in sorted(report.unavailable.items()):
        asked = " (asked for: the run FAILS)" if kind in report.not_run else ""
        console.print(f"  not available here: {kind}: {why}{asked}")
    if report.by_fault:
        per = Table(title="per fault kind (a message counts under the last fault before it)")
        per.add_column("fault")
        for name in PER_FAULT:
            per.add_column(name, justify="right")
        for kind, c in report.by_fault.items():
            per.add_row(kind, *(str(c[n]) for n in PER_FAULT))
        console.print(per)
    takeovers = [e for e in report.fault_log if e["fault"] == "relay_takeover"]
    if takeovers:
        took = ", ".join(f"{e['took_over_s']:g} s" for e in takeovers)
        console.print(
            f"  takeovers: {len(takeovers)} (the new machine held the host id after {took}); "
            f"{len(takeovers) - report.unfenced} woken relays exited fenced having handed "
            "nothing over"
        )
    for e in (e for e in report.fault_log if e["fault"] == "pg_failover"):
        flows = e.get("flows_again_s")
        console.print(
            f"  pg_failover at {e['t']:g} s: standby promoted in {e['promote_s']:g} s; mail "
            + (f"flowed again after {flows:g} s" if flows is not None else "did NOT flow again")
            + (
                f"; old primary back as a standby in {e['rejoin_s']:g} s ({e['rejoined_by']})"
                if "rejoin_s" in e
                else f"; rejoin: {e.get('rejoin_error', 'not done')}"
            )
        )
    if report.failover_loss_window_s is not None:
        console.print(
            "  lost to a failover: sent up to "
            f"{report.failover_loss_window_s:g} s before the old primary stopped"
        )
    if report.quarantine_reasons:
        console.print(f"  quarantine reasons: {report.quarantine_reasons}")
    if report.codes:
        console.print(f"  outcome codes: {report.codes}")
    console.print(f"  drain took {report.drain_s} s; whole run {report.elapsed_s} s")
    verdict = "OK: nothing acknowledged was lost, nothing duplicated"
    if report.injected:
        verdict += f"; {report.quarantined} of {report.injected} hostile rows quarantined"
    if not report.ok:
        verdict = (
            f"FAILED: {report.lost} lost, {report.duplicated} duplicated, "
            f"{report.quarantined} of {report.injected} hostile rows quarantined, "
            f"{report.hostile_in_inboxes} in an inbox, {report.unfenced} stale relays not "
            f"fenced, not run: {', '.join(report.not_run) or 'none'}"
        )
    console.print(verdict)
