"""The attention view at the top of the page (docs/web.md, "Needs attention"), on two simulated
hosts with the archive off: an ask between two agents waits there with its age and its asker's
timeout until it is answered; a decision and an interview sent to the overseer are rendered as
such and answered from the page (the `escalate` commands get the answers); a progress update
shows its percentage; an ask to the overseer is answered from its entry; a refusal shows its
code; a session offline with mail waiting is listed; the tab title carries the count; each entry
links to its message page, which shows attachments, flags and receipts; hostile text stays text
throughout (on five hosts with the archive on too). A host whose relay stops is listed as lapsed
until it is back, and leaves the host list (not the history) once lapsed past
``--drop-hosts-after``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import background_cli
from tests.relay.conftest import Cluster, wait_for
from tests.web.conftest import WebServer, hosts_for, open_page, start_web, wait_feed

HOSTILE = '<img src=x onerror="window.__pwned = 1">'


def entry(page: Any, kind: str, mid: str, timeout: float = 30_000) -> Any:
    """The entry as a locator: found again on every use, as the list is pushed anew."""
    found = page.locator(f'#attention-list li[data-kind="{kind}"][data-id="{mid}"]')
    found.wait_for(timeout=timeout)
    return found


def first(page: Any, selector: str) -> Any:
    found = page.locator(selector).first
    found.wait_for(timeout=30_000)
    return found


def gone(page: Any, kind: str, mid: str) -> None:
    page.wait_for_selector(
        f'#attention-list li[data-kind="{kind}"][data-id="{mid}"]', state="detached"
    )


@pytest.mark.parametrize(("n", "archive"), [(2, False), (5, True)])
def test_the_attention_view_lists_and_answers(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer], n: int, archive: bool
) -> None:
    a, b = hosts_for(sqlite_cluster, n, archive)[:2]
    alice = a.listen("alice")
    b.listen("bob")
    b.listen("dora").stop()
    b.wait_sees("alice", "A")
    web = start_web(b, "--as", "boss", "--queued-after", "1")
    web_servers.append(web)
    a.wait_sees("boss", "B")
    page = open_page(browser, web)
    assert page.is_visible("#attention-empty")

    # An ask between two agents (bob on B asks alice on A): waiting, with its age.
    with background_cli(
        b.env, "ask", "--as", "bob", "--to", "alice@A", "--timeout", "120", "--json", "ship it?"
    ) as ask:
        got = alice.next_message()
        item = entry(page, "ask", got["id"])
        assert "waiting" in item.inner_text() and "ship it?" in item.inner_text()
        assert item.locator("button.answer").count() == 0  # not the overseer's to answer
        # bob's client told B's broker its wait: the ask shows its timeout, not yet passed.
        timeout = first(item, ".timeout")
        assert "timeout" in timeout.inner_text() and "passed" not in timeout.inner_text()
        wait_for(lambda: page.title().startswith("("), 20, "a count in the tab title")
        a.cli_json("reply", "--as", "alice", "--reply-to", got["id"], "shipped")
        out, err = ask.communicate(timeout=60)
        assert ask.returncode == 0, (out, err)
    gone(page, "ask", got["id"])

    # A decision for the overseer, with a hostile option: rendered as a decision and
    # answered with one click; the escalate command gets the answer.
    with background_cli(
        a.env, "escalate", "decision", "--as", "alice", "--to", "boss@B", "--option", "go",
        "--option", HOSTILE, "--timeout", "120", "--json", f"deploy now? {HOSTILE}",
    ) as decision:  # fmt: skip
        item = first(page, '#attention-list li[data-kind="escalation"] .escalation.need_decision')
        assert item.locator(".title").inner_text() == f"deploy now? {HOSTILE}"
        choices = item.locator("button.choice")
        assert choices.all_inner_texts() == ["go", HOSTILE]
        choices.first.click()
        out, err = decision.communicate(timeout=60)
    assert decision.returncode == 0, (out, err)
    answer = json.loads(out)["answer"]
    assert answer["valid"] is True and answer["responses"] == [{"id": "decision", "value": "go"}]

    # An interview: a single, a multi and a text question, answered in the form.
    questions = [
        {"id": "env", "type": "single", "question": "which env?", "options": ["prod", "stage"]},
        {"id": "checks", "type": "multi", "question": "checks?", "options": ["lint", "tests"]},
        {"id": "note", "type": "text", "question": "anything else?"},
    ]
    with background_cli(
        a.env, "escalate", "interview", "--as", "alice", "--to", "boss@B", "--title", "rollout",
        "--timeout", "120", "--json", json.dumps(questions),
    ) as interview:  # fmt: skip
        form = first(page, '#attention-list li[data-kind="escalation"] .interview_request form')
        form.locator('select[data-qid="env"]').select_option("stage")
        form.locator('fieldset[data-qid="checks"] input[value="tests"]').check()
        form.locator('textarea[data-qid="note"]').fill("after lunch")
        # News about another entry while the form is half filled in does not wipe it.
        other = b.cli_json("send", "--as", "bob", "--to", "nobody-yet", "hi", expect_rc=3)
        entry(page, "refused", other["error"]["id"])
        assert form.locator('textarea[data-qid="note"]').input_value() == "after lunch"
        assert form.locator('select[data-qid="env"]').input_value() == "stage"
        form.locator('button[type="submit"]').click()
        out, err = interview.communicate(timeout=60)
    assert interview.returncode == 0, (out, err)
    responses = {r["id"]: r["value"] for r in json.loads(out)["answer"]["responses"]}
    assert responses == {"env": "stage", "checks": ["tests"], "note": "after lunch"}

    # A progress update is shown as progress, in the feed too.
    progress = a.cli_json(
        "escalate", "progress", "--as", "alice", "--to", "boss@B", "--percent", "40", "halfway"
    )
    pid = progress["sent"]["id"] if "sent" in progress else progress["id"]
    item = entry(page, "escalation", pid)
    assert item.locator("progress").get_attribute("value") == "40"
    page.wait_for_selector(f'#feed li[data-id="{pid}"] .escalation.progress_update')

    # An ask to the overseer: answered from its entry through the compose form.
    with background_cli(
        a.env, "ask", "--as", "alice", "--to", "boss@B", "--timeout", "120", "--json", "lunch?"
    ) as ask:
        first(page, '#attention-list li[data-kind="ask"] button.answer').click()
        assert page.input_value('#compose-form [name="mode"]') == "reply"
        assert page.input_value('#compose-form [name="to"]') == "alice@A"
        page.fill('#compose-form [name="message"]', "yes")
        page.click('#compose-form button[type="submit"]')
        out, err = ask.communicate(timeout=60)
    assert ask.returncode == 0 and json.loads(out)["reply"]["message"] == "yes", (out, err)

    # A refusal with its code, and dora offline with mail waiting.
    refused = b.cli_json("send", "--as", "bob", "--to", "nobody", HOSTILE, expect_rc=3)["error"]
    item = entry(page, "refused", refused["id"])
    assert refused["code"] in item.inner_text()
    queued = b.cli_json("send", "--as", "bob", "--to", "dora", "later")
    assert queued["outcome"] == "queued"
    entry(page, "offline", b.session_id("dora"))
    page.wait_for_selector('#sessions tr[data-name="dora"] td.queued:text-is("1")')
    assert "queued for dora@B" in entry(page, "queued", queued["id"]).inner_text()
    assert page.title().startswith("(")

    # Each entry links to the message's own page: text, flags, receipts, attachments.
    href = entry(page, "refused", refused["id"]).locator("a.perma").get_attribute("href")
    page.goto(web.base + href)
    assert page.inner_text("#message .to") == "nobody"
    assert page.inner_text("#text") == HOSTILE and page.query_selector("#text img") is None
    assert "refused" in page.inner_text("#receipts")
    page.goto(web.base + f"/message/{pid}")
    assert "crossintercom-escalation.json" in page.inner_text(".attachment-full figcaption")
    assert page.evaluate("window.__pwned") is None
    page.close()


def test_a_lapsed_host_is_listed_until_its_relay_is_back(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    quick = {"lease_s": 2.0}
    a, b = sqlite_cluster.up("A", "B", A=quick, B=quick)
    web = start_web(b, "--as", "boss")
    web_servers.append(web)
    page = open_page(browser, web)
    page.wait_for_selector('#hosts tr[data-host="A"] .lease.held')
    assert page.inner_text('#hosts tr[data-host="A"] .beat').endswith("s ago")
    a.kill_relay()
    item = entry(page, "lapsed", "A")
    assert "A" in item.inner_text()
    assert page.title().startswith("(")
    a.start_relay()
    gone(page, "lapsed", "A")
    page.close()


def test_a_host_lapsed_past_drop_hosts_after_leaves_the_list_but_not_the_history(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    quick = {"lease_s": 2.0}
    a, b = sqlite_cluster.up("A", "B", A=quick, B=quick)
    web = start_web(b, "--as", "boss", "--drop-hosts-after", "4")
    web_servers.append(web)
    a.wait_sees("boss", "B")
    page = open_page(browser, web)
    sent = a.cli_json("send", "--as", "alice", "--to", "boss@B", HOSTILE)
    page.wait_for_selector(f'#feed li[data-id="{sent["id"]}"]')
    page.wait_for_selector('#hosts tr[data-host="A"] .lease.held')
    assert page.inner_text('#hosts tr[data-host="A"] .beat').endswith("s ago")  # its age
    a.kill_relay()
    entry(page, "lapsed", "A")
    page.wait_for_selector('#hosts tr[data-host="A"] .lease.lapsed')
    # Lapsed past --drop-hosts-after: out of the host list and of the attention view.
    page.wait_for_selector('#hosts tr[data-host="A"]', state="detached")
    gone(page, "lapsed", "A")
    assert page.query_selector('#hosts tr[data-host="B"]') is not None
    # Its mail is still found by the host filter.
    page.fill('#filter-form [name="host"]', "A")
    page.click('#filter-form button[type="submit"]')
    wait_feed(page, [sent["id"]], "the feed filtered to A")
    assert page.evaluate("window.__pwned") is None
    page.close()
