"""Escalations as the page shows them (docs/agents.md#escalations): an escalation is a message
with one attachment holding its structure; the page renders decisions, interviews and progress
from it and answers with ``{"responses": [{"id", "value"}]}``. The web layer does not import
the agents' package, so the attachment's name is repeated here."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

ESCALATION_ATTACHMENT: Final = "crossintercom-escalation.json"
KINDS: Final = ("need_decision", "interview_request", "progress_update")
_QUESTION_FIELDS: Final = ("id", "type", "question", "options", "context")


def escalation_of(m: Mapping[str, Any]) -> dict[str, Any] | None:
    """The escalation a message carries (docs/agents.md#escalations), as plain fields for the
    page, or None. Read defensively: an agent wrote it."""
    for a in m.get("attachments") or ():
        if a.get("name") != ESCALATION_ATTACHMENT:
            continue
        try:
            d = json.loads(str(a.get("content", "")))
        except ValueError:
            return None
        if not isinstance(d, dict) or d.get("kind") not in KINDS:
            return None
        questions = [
            {k: q[k] for k in _QUESTION_FIELDS if k in q}
            for q in d.get("questions") or ()
            if isinstance(q, dict) and isinstance(q.get("id"), str)
        ]
        for q in questions:
            if not isinstance(q.get("options"), list):
                q.pop("options", None)
            else:
                q["options"] = [str(o) for o in q["options"]]
        percent = d.get("percent")
        return {
            "kind": d["kind"],
            "title": str(d["title"]) if d.get("title") is not None else None,
            "context": str(d["context"]) if d.get("context") is not None else None,
            "percent": percent if isinstance(percent, int | float) else None,
            "questions": questions,
        }
    return None
