"""Escalations: questions checked when built, answers checked against them, raw text kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crossintercom.agents.escalations.escalation import (
    ATTACHMENT_NAME,
    Escalation,
    EscalationError,
    answer_text,
    escalation_of,
    parse_answer,
)

QUESTIONS: list[dict[str, Any]] = [
    {"id": "db", "type": "single", "question": "Which database?", "options": ["pg", "sqlite"]},
    {"id": "envs", "type": "multi", "question": "Where?", "options": ["dev", "ci", "prod"]},
    {"id": "why", "type": "text", "question": "Why?", "context": "one line"},
    {"id": "note", "type": "info", "question": "Deploys freeze on Friday."},
]


def interview() -> Escalation:
    return Escalation.interview(QUESTIONS, "rollout")


def test_structure_travels_in_one_context_attachment() -> None:
    esc = interview()
    att = esc.attachment()
    assert (att.kind, att.name) == ("context", ATTACHMENT_NAME)
    m = {"message": esc.render_text(), "attachments": [att.to_dict()]}
    assert escalation_of(m) == esc
    text = esc.render_text()
    assert "[interview request] rollout" in text
    assert "[db, single: pg | sqlite] Which database?" in text
    assert escalation_of({"message": "hi", "attachments": []}) is None


def test_bad_questions_are_refused_with_every_problem() -> None:
    with pytest.raises(EscalationError) as err:
        Escalation.interview(
            [
                {"id": "a", "type": "single", "question": "?"},
                {"id": "a", "type": "image", "question": ""},
                {"id": "bad id", "type": "text", "question": "x", "options": ["y"]},
            ]
        )
    problems = err.value.problems
    assert any("needs options" in p for p in problems)
    assert any("type must be one of" in p for p in problems)
    assert any("question must be a non-empty string" in p for p in problems)
    assert any("options apply only" in p for p in problems)
    assert any("id must be" in p for p in problems)
    assert any("ids repeat: a" in p for p in problems)
    assert err.value.code == "invalid_escalation"


def test_valid_structured_answer() -> None:
    raw = json.dumps(
        {
            "responses": [
                {"id": "db", "value": "pg"},
                {"id": "envs", "value": ["dev", "ci"]},
                {"id": "why", "value": "it scales"},
            ]
        }
    )
    answer = parse_answer(interview(), raw)
    assert answer.valid, answer.problems
    assert answer.responses == {"db": "pg", "envs": ["dev", "ci"], "why": "it scales"}
    assert answer.raw == raw


def test_invalid_answer_lists_what_is_wrong_and_keeps_the_raw_text() -> None:
    raw = json.dumps(
        {
            "responses": [
                {"id": "db", "value": "mysql"},
                {"id": "envs", "value": ["dev", "moon", "dev"]},
                {"id": "nope", "value": 1},
                {"id": "db", "value": "pg"},
            ]
        }
    )
    answer = parse_answer(interview(), raw)
    assert not answer.valid
    text = "; ".join(answer.problems)
    assert "'mysql' is not one of the options" in text
    assert "not among the options: 'moon'" in text
    assert "no question has id 'nope'" in text
    assert "db: answered twice" in text
    assert "no answer for: why" in text
    assert answer.raw == raw
    assert parse_answer(interview(), "sure, go ahead").problems == (
        'the reply is not JSON {"responses": [{"id", "value"}]}',
    )


def test_answer_text_refuses_to_build_an_invalid_answer() -> None:
    with pytest.raises(EscalationError) as err:
        answer_text(interview(), {"db": "pg"})
    assert "no answer for: envs, why" in err.value.message
    good = answer_text(interview(), {"db": "sqlite", "envs": [], "why": "small"})
    assert json.loads(good)["responses"][0] == {"id": "db", "value": "sqlite"}


def test_decision_accepts_plain_words_or_structure() -> None:
    esc = Escalation.decision("Ship it?", ["Yes", "No"], context="tests are green")
    assert esc.render_text().startswith("[decision needed] Ship it?\nOptions: Yes | No")
    assert parse_answer(esc, "yes").responses == {"decision": "Yes"}
    assert not parse_answer(esc, "maybe").valid
    open_question = Escalation.decision("What name?")
    assert parse_answer(open_question, "crossintercom").responses == {"decision": "crossintercom"}
    assert parse_answer(esc, '{"responses": [{"id": "decision", "value": "No"}]}').valid


def test_progress_is_fire_and_forget() -> None:
    esc = Escalation.progress("migrations done", 40, "next: tests")
    assert not esc.blocking
    assert esc.render_text() == "[progress update] migrations done (40%)\nnext: tests"
    with pytest.raises(EscalationError):
        Escalation.progress("x", 140)


def test_a_late_answer_is_read_against_the_questions_it_answers(tmp_path: Any) -> None:
    from crossintercom.agents.escalations.supervisor import EscalationLog
    from crossintercom.config import load_settings

    settings = load_settings({"CROSSINTERCOM_HOME": str(tmp_path), "CROSSINTERCOM_HOST_ID": "h"})
    log = EscalationLog(settings, "sid")
    log.remember("ask-1", interview())
    late = {"reply_to": "ask-1", "message": '{"responses": [{"id": "db", "value": "pg"}]}'}
    answer = log.answer_in(late)
    assert answer is not None and not answer.valid
    assert "no answer for: envs, why" in answer.problems[0]
    assert log.answer_in({"reply_to": "other", "message": "x"}) is None
