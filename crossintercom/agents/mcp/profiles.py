"""Tool profiles of the MCP server, and the compact ``tools/list`` a harness reads on every turn
(docs/agents.md#tool-profiles).

A harness sends the model every tool's definition with every request, so each tool offered costs
context all session long. ``core`` offers what every session needs to talk; the other profiles add
coordination, escalations, or everything. A tool left out is still the CLI's command of the same
name. Schemas are cut to what a model needs: no titles, no ``null`` branches, no ``null`` defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

CORE = ("whoami", "list_sessions", "send", "ask", "reply", "pending", "inbox")
COORD = (
    "groups",
    "join",
    "leave",
    "set_status",
    "receipts",
    "ack",
    "acks",
    "reserve",
    "unreserve",
    "reservations",
)
SUPERVISION = (
    "escalate_decision",
    "escalate_interview",
    "escalate_progress",
    "answer_escalation",
    "receipts",
)
# The order tools/list gives them in, the same for every profile; a tool not named here comes
# after these.
ORDER = (
    "whoami",
    "list_sessions",
    "pending",
    "groups",
    "send",
    "ask",
    "reply",
    "inbox",
    "join",
    "leave",
    "set_status",
    "escalate_decision",
    "escalate_interview",
    "escalate_progress",
    "answer_escalation",
    "set_wake",
    "receipts",
    "ack",
    "acks",
    "dead_letters",
    "resend",
    "inbound_policy",
    "reserve",
    "unreserve",
    "reservations",
)
PROFILES: Mapping[str, tuple[str, ...] | None] = {
    "core": CORE,
    "coord": CORE + COORD,
    "supervisor": CORE + SUPERVISION,
    "all": None,  # every tool
}
DEFAULT_PROFILE = "core"
# With a supervisor named, the escalation tools are what it is for (docs/agents.md#escalations).
SUPERVISED_PROFILE = "supervisor"


def in_order(tools: Mapping[str, T]) -> dict[str, T]:
    """``tools`` by name, in the order tools/list gives them (``ORDER``)."""
    rest = dict(tools)
    return {name: rest.pop(name) for name in ORDER if name in rest} | rest


def offered(profile: str, names: list[str]) -> list[str]:
    """The tools of ``names`` the profile offers, in their order."""
    wanted = PROFILES[profile]
    return [n for n in names if wanted is None or n in wanted]


def compact(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A tool's input schema without what a model does not need: titles, ``anyOf`` branches of
    ``null`` (an optional argument is one left out), and ``null`` defaults."""
    out: dict[str, Any] = {k: v for k, v in schema.items() if k != "title"}
    props = schema.get("properties")
    if isinstance(props, Mapping):
        out["properties"] = {str(k): _compact_property(v) for k, v in props.items()}
    return out


def _compact_property(prop: Any) -> Any:
    if not isinstance(prop, Mapping):
        return prop
    out = {k: v for k, v in prop.items() if k != "title" and not (k == "default" and v is None)}
    branches = out.get("anyOf")
    if isinstance(branches, list):
        kept = [b for b in branches if b != {"type": "null"}]
        if len(kept) == 1 and isinstance(kept[0], Mapping):
            del out["anyOf"]
            out = {**kept[0], **out}
        else:
            out["anyOf"] = kept
    return out
