"""Escalations to a supervisor, carried without changing the wire.

An escalation is an ordinary message: its text is a readable rendering (so a person or a plain
``listen`` sees what is asked) and it has one attachment of kind ``context`` named
``crossintercom-escalation.json`` holding the structure. Three kinds (docs/agents.md#escalations):

- ``need_decision``: a blocking ask with one question (``id`` "decision"), with or without options;
- ``interview_request``: a blocking ask with questions ``{id, type, question, options?, context?}``,
  ``type`` one of single / multi / text / info;
- ``progress_update``: fire and forget.

An answer is the reply text ``{"responses": [{"id", "value"}]}``; it is validated against the
question ids and options, and the raw text is always kept beside the parsed responses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from crossintercom.errors import Code, UsageError
from crossintercom.models import Attachment
from crossintercom.safetext import one_line, quoted

ATTACHMENT_NAME = "crossintercom-escalation.json"
KINDS = ("need_decision", "interview_request", "progress_update")
QUESTION_TYPES = ("single", "multi", "text", "info")
DECISION_ID = "decision"
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_QUESTIONS = 50


class EscalationError(UsageError):
    """An escalation or its answer is not valid; ``problems`` lists every reason."""

    code = Code.INVALID_ESCALATION

    def __init__(self, problems: Sequence[str], what: str = "escalation") -> None:
        self.problems = list(problems)
        super().__init__(f"invalid {what}: " + "; ".join(self.problems), problems=self.problems)


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    type: str
    question: str
    options: tuple[str, ...] = ()
    context: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "type": self.type, "question": self.question}
        if self.options:
            d["options"] = list(self.options)
        if self.context:
            d["context"] = self.context
        return d

    @property
    def needs_answer(self) -> bool:
        return self.type != "info"


def _question_problems(raw: Any, n: int) -> list[str]:
    where = f"question {n + 1}"
    if not isinstance(raw, Mapping):
        return [f"{where} is not an object"]
    out = []
    qid, qtype = raw.get("id"), raw.get("type")
    if not isinstance(qid, str) or not _ID_RE.fullmatch(qid):
        out.append(f"{where}: id must be 1-64 letters, digits, '.', '_' or '-'")
    else:
        where = f"question {qid!r}"
    if qtype not in QUESTION_TYPES:
        out.append(f"{where}: type must be one of {', '.join(QUESTION_TYPES)}, got {qtype!r}")
    if not isinstance(raw.get("question"), str) or not raw["question"].strip():
        out.append(f"{where}: question must be a non-empty string")
    options = raw.get("options")
    if qtype in ("single", "multi"):
        if (
            not isinstance(options, list)
            or not options
            or not all(isinstance(o, str) and o.strip() for o in options)
        ):
            out.append(f"{where}: a {qtype} question needs options, a list of non-empty strings")
        elif len(set(options)) != len(options):
            out.append(f"{where}: options repeat")
    elif options not in (None, []):
        out.append(f"{where}: options apply only to single and multi questions")
    if raw.get("context") is not None and not isinstance(raw.get("context"), str):
        out.append(f"{where}: context must be a string")
    unknown = set(raw) - {"id", "type", "question", "options", "context"}
    if unknown:
        out.append(f"{where}: unknown fields {', '.join(sorted(unknown))}")
    return out


def parse_questions(raw: Any) -> tuple[Question, ...]:
    """Questions from untrusted JSON (a tool argument, a CLI file, a received attachment)."""
    if not isinstance(raw, list) or not raw:
        raise EscalationError(["questions must be a non-empty list"])
    if len(raw) > MAX_QUESTIONS:
        raise EscalationError([f"at most {MAX_QUESTIONS} questions"])
    problems = [p for n, q in enumerate(raw) for p in _question_problems(q, n)]
    ids = [q.get("id") for q in raw if isinstance(q, Mapping)]
    repeated = sorted({str(i) for i in ids if ids.count(i) > 1})
    if repeated:
        problems.append(f"question ids repeat: {', '.join(repeated)}")
    if problems:
        raise EscalationError(problems)
    return tuple(
        Question(q["id"], q["type"], q["question"], tuple(q.get("options") or ()), q.get("context"))
        for q in raw
    )


@dataclass(frozen=True, slots=True)
class Escalation:
    kind: str
    questions: tuple[Question, ...] = ()
    title: str | None = None  # interview title, decision question, or progress summary
    context: str | None = None
    percent: float | None = None

    # --- building ------------------------------------------------------------------------------

    @classmethod
    def decision(
        cls, question: str, options: Sequence[str] = (), context: str | None = None
    ) -> Escalation:
        qtype = "single" if options else "text"
        raw = {"id": DECISION_ID, "type": qtype, "question": question, "options": list(options)}
        qs = parse_questions([{k: v for k, v in raw.items() if v or k != "options"}])
        return cls("need_decision", qs, question, context)

    @classmethod
    def interview(cls, questions: Any, title: str | None = None) -> Escalation:
        return cls("interview_request", parse_questions(questions), title)

    @classmethod
    def progress(
        cls, summary: str, percent: float | None = None, details: str | None = None
    ) -> Escalation:
        problems = []
        if not summary.strip():
            problems.append("summary must be a non-empty string")
        if percent is not None and not 0 <= percent <= 100:
            problems.append("percent must be between 0 and 100")
        if problems:
            raise EscalationError(problems)
        return cls("progress_update", (), summary, details, percent)

    @property
    def blocking(self) -> bool:
        return self.kind != "progress_update"

    # --- the wire form -------------------------------------------------------------------------

    def to_payload(self) -> dict[str, Any]:
        d: dict[str, Any] = {"crossintercom_escalation": 1, "kind": self.kind}
        if self.title is not None:
            d["title"] = self.title
        if self.context is not None:
            d["context"] = self.context
        if self.percent is not None:
            d["percent"] = self.percent
        if self.questions:
            d["questions"] = [q.to_dict() for q in self.questions]
        return d

    def attachment(self) -> Attachment:
        return Attachment("context", ATTACHMENT_NAME, json.dumps(self.to_payload()))

    @classmethod
    def from_payload(cls, d: Any) -> Escalation:
        if not isinstance(d, Mapping) or d.get("kind") not in KINDS:
            raise EscalationError(["not an escalation payload"])
        title = d.get("title")
        if d["kind"] == "progress_update":
            percent = d.get("percent")
            return cls.progress(
                str(title or ""),
                float(percent) if isinstance(percent, int | float) else None,
                d.get("context") if isinstance(d.get("context"), str) else None,
            )
        return cls(
            d["kind"],
            parse_questions(d.get("questions")),
            str(title) if title is not None else None,
            d.get("context") if isinstance(d.get("context"), str) else None,
        )

    def render_text(self) -> str:
        """The readable message text (what a person or a plain listener sees)."""
        if self.kind == "progress_update":
            pct = f" ({self.percent:g}%)" if self.percent is not None else ""
            return f"[progress update] {self.title}{pct}" + (
                f"\n{self.context}" if self.context else ""
            )
        if self.kind == "need_decision":
            q = self.questions[0]
            lines = [f"[decision needed] {q.question}"]
            if q.options:
                lines.append("Options: " + " | ".join(q.options))
            if self.context:
                lines.append(f"Context: {self.context}")
            lines.append(
                "Answer with one of the options." if q.options else "Answer in your own words."
            )
            return "\n".join(lines)
        lines = ["[interview request]" + (f" {self.title}" if self.title else "")]
        lines.append('Answer with JSON {"responses": [{"id": ..., "value": ...}]}:')
        for n, q in enumerate(self.questions, 1):
            spec = q.type + (": " + " | ".join(q.options) if q.options else "")
            lines.append(f"{n}. [{q.id}, {spec}] {q.question}")
            if q.context:
                lines.append(f"   context: {q.context}")
        return "\n".join(lines)


def escalation_of(message: Mapping[str, Any]) -> Escalation | None:
    """The escalation a message object carries, or None (a malformed one counts as none)."""
    for a in message.get("attachments") or ():
        if a.get("kind") == "context" and a.get("name") == ATTACHMENT_NAME:
            try:
                return Escalation.from_payload(json.loads(str(a.get("content", ""))))
            except (ValueError, EscalationError):
                return None
    return None


# --- answers ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """A reply to a blocking escalation: parsed responses, what is wrong, and the raw text."""

    raw: str
    responses: dict[str, Any] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "responses": [{"id": k, "value": v} for k, v in self.responses.items()],
            "problems": list(self.problems),
            "raw": self.raw,
        }


def _value_problems(q: Question, value: Any) -> list[str]:
    if q.type == "single":
        if value not in q.options:
            return [f"{q.id}: {value!r} is not one of the options ({' | '.join(q.options)})"]
    elif q.type == "multi":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return [f"{q.id}: a multi answer is a list of options"]
        wrong = [v for v in value if v not in q.options]
        if wrong:
            return [f"{q.id}: not among the options: {', '.join(map(repr, wrong))}"]
        if len(set(value)) != len(value):
            return [f"{q.id}: an option is chosen twice"]
    elif q.type == "text" and (not isinstance(value, str) or not value.strip()):
        return [f"{q.id}: a text answer is a non-empty string"]
    return []


def check_responses(esc: Escalation, responses: Any) -> tuple[dict[str, Any], list[str]]:
    """Validate ``[{"id", "value"}]`` against the questions; (parsed, problems)."""
    if not isinstance(responses, list):
        return {}, ['"responses" must be a list of {"id", "value"} objects']
    by_id = {q.id: q for q in esc.questions}
    parsed: dict[str, Any] = {}
    problems: list[str] = []
    for n, r in enumerate(responses, 1):
        if not isinstance(r, Mapping) or "id" not in r or "value" not in r:
            problems.append(f'response {n} is not an object with "id" and "value"')
            continue
        rid = r["id"]
        if rid not in by_id:
            problems.append(f"response {n}: no question has id {rid!r}")
        elif rid in parsed:
            problems.append(f"{rid}: answered twice")
        else:
            problems += _value_problems(by_id[rid], r["value"])
            parsed[rid] = r["value"]
    missing = [q.id for q in esc.questions if q.needs_answer and q.id not in parsed]
    if missing:
        problems.append(f"no answer for: {', '.join(missing)}")
    return parsed, problems


def parse_answer(esc: Escalation, raw: str) -> Answer:
    """Read a reply's text as an answer to ``esc``; plain text is taken for a lone question."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, Mapping) and "responses" in data:
        parsed, problems = check_responses(esc, data["responses"])
        return Answer(raw, parsed, tuple(problems))
    needing = [q for q in esc.questions if q.needs_answer]
    if len(needing) == 1 and needing[0].type in ("single", "text"):
        # A decision answered in plain words ("yes", or one option) is an answer too.
        q = needing[0]
        value = raw.strip()
        if q.type == "single":
            value = next((o for o in q.options if o.casefold() == value.casefold()), value)
        problems = _value_problems(q, value)
        return Answer(raw, {q.id: value} if not problems else {}, tuple(problems))
    return Answer(raw, {}, ('the reply is not JSON {"responses": [{"id", "value"}]}',))


def answer_text(esc: Escalation, responses: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> str:
    """The reply text for ``responses`` (a mapping id -> value, or a list of {id, value});
    raises ``EscalationError`` listing every problem, so nothing invalid is sent."""
    items = (
        [{"id": k, "value": v} for k, v in responses.items()]
        if isinstance(responses, Mapping)
        else list(responses)
    )
    _, problems = check_responses(esc, items)
    if problems:
        raise EscalationError(problems, "answer")
    return json.dumps({"responses": items}, ensure_ascii=False)


def hint_for(m: Mapping[str, Any]) -> str | None:
    """What the recipient of an escalation should do with it (appended to the frame)."""
    esc = escalation_of(m)
    if esc is None:
        return None
    mid = m.get("id")
    if esc.kind == "progress_update":
        return "This is a progress update from a session you supervise; no answer is expected."
    return (
        f"This is a {esc.kind.replace('_', ' ')} from a session you supervise: answer it with "
        f'the crossintercom answer_escalation tool (reply_to="{mid}"), one response per question '
        "id; the answer is checked against the questions before it is sent."
    )


def answer_note(answer: Mapping[str, Any]) -> str:
    """An escalation's answer as checked (``Answer.to_dict()``), for a model, in one line. The
    values are the supervisor's words: each is quoted, so none stands where our note speaks."""
    if answer["valid"]:
        values = "; ".join(
            f"{one_line(r['id'])} = {quoted(json.dumps(r['value'], ensure_ascii=False), 500)}"
            for r in answer["responses"]
        )
        return "valid; responses, in the supervisor's words: " + values
    return "it does NOT fit the questions: " + "; ".join(quoted(p, 500) for p in answer["problems"])
