"""Two `crossintercom mcp` servers on two simulated hosts, driven by the MCP SDK's own stdio
client, over a shared SQLite file and over PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.agents.conftest import Cluster, Host, Mcp, mcp_server, parse_mail, until

READ_ONLY = {
    "whoami",
    "list_sessions",
    "pending",
    "groups",
    "receipts",
    "acks",
    "dead_letters",
    "reservations",
}
QUESTIONS = [
    {"id": "db", "type": "single", "question": "Which database?", "options": ["pg", "sqlite"]},
    {"id": "envs", "type": "multi", "question": "Where?", "options": ["dev", "ci", "prod"]},
    {"id": "why", "type": "text", "question": "Why?"},
    {"id": "note", "type": "info", "question": "Deploys freeze on Friday."},
]


async def next_mail(m: Mcp, timeout: float = 30) -> dict[str, Any]:
    """Call the inbox tool until it returns something (mail crossing hosts takes a moment)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await m.call("inbox")
        assert not result.is_error, result.content[0].text
        text = str(result.content[0].text)
        if found := parse_mail(text):
            return {"text": text, "messages": found}
        if loop.time() > deadline:
            raise AssertionError(f"{m.name} got no mail in {timeout}s")
        await asyncio.sleep(0.1)


async def next_pending(m: Mcp, timeout: float = 30) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await m.call("pending")
        assert not result.is_error, result.content[0].text
        if asks := parse_mail(str(result.content[0].text)):
            return {"text": result.content[0].text, **asks[0]}
        if loop.time() > deadline:
            raise AssertionError(f"no ask reached {m.name} in {timeout}s")
        await asyncio.sleep(0.1)


def test_two_mcp_servers_exchange_send_ask_reply_interview(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    asyncio.run(_exchange(a, b))


async def _exchange(a: Host, b: Host) -> None:
    async with (
        mcp_server(a.env, "worker", "--supervisor", "lead@B", "--profile", "all") as (
            worker,
            init,
        ),
        mcp_server(b.env, "lead", "--profile", "supervisor") as (lead, _),
    ):
        tools = {t.name: t for t in (await worker.session.list_tools()).tools}
        assert set(tools) >= READ_ONLY | {"send", "ask", "reply", "inbox", "escalate_interview"}
        for name, tool in tools.items():
            assert tool.annotations is not None
            assert tool.annotations.read_only_hint is (name in READ_ONLY), name
        assert init.instructions is not None
        assert "Use send for" in init.instructions and "use ask only" in init.instructions
        assert "unknown must never be resent" in init.instructions

        await until(lambda: b.sees("worker", "A") and a.sees("lead", "B"), 30, "rosters")
        listed = (await worker.text("list_sessions", host="B")).splitlines()
        assert len(listed) == 2 and listed[1].startswith("- lead@B (online;"), listed
        me = await worker.data("whoami")
        assert (me["name"], me["host"], me["supervisor"]) == ("worker", "A", "lead@B")
        assert me["holds_session"] is True

        # send: delivered across hosts, framed as another agent's words on the other side
        sent = await worker.data("send", to="lead", message="hello lead")
        assert sent["outcome"] == "delivered"
        mail = await next_mail(lead)
        assert [m["id"] for m in mail["messages"]] == [sent["id"]]
        assert "from worker@A" in mail["text"] and "│ hello lead" in mail["text"]
        assert "not by your user" in mail["text"]
        assert await lead.mail("inbox") == []  # shown once

        # ask -> reply: the ask returns the reply
        asking = asyncio.create_task(worker.call("ask", to="lead", message="ready?", timeout_s=60))
        question = await next_pending(lead)
        replied = await lead.data("reply", message="yes, ready")
        assert replied["outcome"] in ("delivered", "queued")
        answer = await asking
        assert not answer.is_error
        (got,) = parse_mail(answer.content[0].text)
        assert (got["message"], got["reply_to"]) == ("yes, ready", question["id"])
        assert "The reply:" in answer.content[0].text

        # interview to the supervisor, a wrong answer refused with every problem, then a good one
        interviewing = asyncio.create_task(
            worker.call("escalate_interview", questions=QUESTIONS, title="rollout", timeout_s=60)
        )
        asked = await next_pending(lead)  # shown there: the inbox does not show it again
        assert "[interview request] rollout" in asked["text"]
        assert "answer_escalation" in asked["text"]
        bad = await lead.call(
            "answer_escalation", reply_to=asked["id"], responses=[{"id": "db", "value": "mysql"}]
        )
        assert bad.is_error
        assert bad.structured_content["error"]["code"] == "invalid_escalation"
        assert "'mysql' is not one of the options" in bad.content[0].text
        assert "no answer for: envs, why" in bad.content[0].text
        assert await lead.mail("pending"), "a refused answer consumes nothing"
        good = [
            {"id": "db", "value": "pg"},
            {"id": "envs", "value": ["dev", "ci"]},
            {"id": "why", "value": "it scales"},
        ]
        ok = await lead.data("answer_escalation", reply_to=asked["id"], responses=good)
        assert ok["outcome"] in ("delivered", "queued")
        result = await interviewing
        # the answer as checked stands inside the reply's frame
        (reply,) = parse_mail(result.content[0].text)
        assert json.loads(reply["message"]) == {"responses": good}
        note = (
            "The answer, as checked: valid; responses, in the supervisor's words: "
            'db = \u00ab"pg"\u00bb; envs = \u00ab["dev", "ci"]\u00bb; why = \u00ab"it scales"\u00bb'
        )
        assert note in result.content[0].text.split("<<<end crossintercom reply")[0]

        # an ask nobody answers in time: the result says so; the late answer lands in the inbox
        late = await worker.call("ask", to="lead", message="later?", timeout_s=1)
        assert "No reply yet" in late.content[0].text
        assert "will arrive in your inbox" in late.content[0].text
        later = await next_pending(lead)
        await lead.data("reply", message="here it is", reply_to=later["id"])
        arrived = await next_mail(worker)
        assert arrived["messages"][0]["message"] == "here it is"
        assert "late" in arrived["messages"][0]["flags"]

        # progress: fire and forget
        progress = await worker.data("escalate_progress", summary="half done", percent=50)
        assert progress["outcome"] in ("delivered", "queued")
        assert "[progress update] half done (50%)" in (await next_mail(lead))["text"]


def test_bad_tool_arguments_get_a_code_and_send_nothing(cluster: Cluster) -> None:
    (a,) = cluster.up("A")
    asyncio.run(_bad_arguments(a))


async def _bad_arguments(a: Host) -> None:
    async with (
        mcp_server(a.env, "worker", "--profile", "supervisor") as (worker, _),
        mcp_server(a.env, "lead") as (lead, _),
    ):
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("send", {"to": "lead"}, "message: Field required"),
            ("send", {"to": "lead", "message": ""}, "message"),
            ("send", {"to": "lead", "message": "x", "text": "y"}, "takes no argument 'text'"),
            ("ask", {"to": "lead", "message": "x", "timeout_s": "soon"}, "timeout_s"),
            ("ask", {"to": "lead", "message": "x", "timeout_s": 6000}, "timeout_s"),
            ("inbox", {"limit": 0}, "limit"),
            ("escalate_decision", {"question": "ship?"}, "no recipient"),
            ("escalate_interview", {"questions": [], "to": "lead"}, "non-empty list"),
            ("no_such_tool", {}, "no tool 'no_such_tool'"),
        ]
        for tool, args, says in cases:
            result = await worker.call(tool, **args)
            assert result.is_error, (tool, args)
            code = result.structured_content["error"]["code"]
            assert code in ("invalid_argument", "invalid_escalation", "unknown_tool"), code
            assert says in result.content[0].text, result.content[0].text
        assert await lead.mail("inbox", unseen_only=False) == []  # nothing sent
