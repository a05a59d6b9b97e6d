"""`crossintercom search` and `crossintercom archive` (docs/archive.md)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import click

from crossintercom.cli.common import json_option, settings
from crossintercom.cli.db import store_option
from crossintercom.cli.output import emit_json
from crossintercom.errors import UsageError
from crossintercom.safetext import for_terminal, terminal_line
from crossintercom.search_model import SearchHit, SearchQuery, search_terms
from crossintercom.timeparse import parse_age, parse_since

if TYPE_CHECKING:
    from crossintercom import history
    from crossintercom.config import Settings
    from crossintercom.storage import ArchiveSettings


@click.command()
@click.argument("query")
@click.option("--from", "sender", metavar="WHO", help="Sender: NAME, NAME@HOSTID or session id.")
@click.option("--to", "recipient", metavar="WHO", help="Recipient: NAME, NAME@HOSTID, session id.")
@click.option("--host", metavar="HOSTID", help="Sent from or delivered to this host.")
@click.option("--thread", metavar="ID", help="Only this thread.")
@click.option("--since", metavar="AGE|DATE", help="Sent since: 30m, 12h, 7d, 2w or an ISO date.")
@click.option("--limit", type=click.IntRange(1, 200), default=20, show_default=True)
@json_option
def search(
    query: str,
    sender: str | None,
    recipient: str | None,
    host: str | None,
    thread: str | None,
    since: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Full-text search of the archive (every host's messages, when the store keeps one),
    otherwise of this host's inboxes; best matches first, with snippets."""
    if not search_terms(query):
        raise UsageError("the query has no words to search for")
    try:
        when = parse_since(since) if since is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cfg = settings()
    q = SearchQuery(query, sender, recipient, host, thread, when, limit)
    result = asyncio.run(_search(cfg, q))
    if as_json:
        emit_json([h.to_json() for h in result.hits])
        return
    where = "the archive" if result.source == "archive" else f"the inboxes on {cfg.host_id}"
    if not result.hits:
        click.echo(f"nothing in {where} matches {terminal_line(repr(query))}")
        return
    click.echo(f"{len(result.hits)} match(es) in {where}, best first:")
    for hit in result.hits:
        click.echo(_format_hit(hit))


async def _search(cfg: Settings, q: SearchQuery) -> history.SearchResult:
    """The archive through the store (one connection, schema checked on opening it) when this
    host has a store and the archive is on; else this host's inboxes."""
    from crossintercom import history
    from crossintercom.storage import open_store
    from crossintercom.storage.connection import connection_url

    url = connection_url(cfg)
    if url is None:
        return await history.search(cfg, q, None)
    store = await open_store(url)
    try:
        return await history.search(cfg, q, await history.history_archive(store))
    finally:
        await store.aclose()


def _format_hit(hit: SearchHit) -> str:
    """One hit for a terminal: its fields came from other sessions (docs/agents.md#framing)."""
    m, f = hit.message, terminal_line
    who = f"{f(m.sender.name or m.sender.id)}@{f(m.sender.host)}"
    head = f"--- {f(m.sent_at)} from {who} to {f(m.to)} id={f(m.id)} thread={f(m.thread)}"
    lines = [head]
    if m.subject:
        lines.append(f"Subject: {f(m.subject)}")
    lines.append(f"  {for_terminal(hit.snippet)}")
    return "\n".join(lines)


@click.command()
@click.argument("action", type=click.Choice(["on", "off", "status"]), default="status")
@click.option(
    "--retention",
    metavar="AGE",
    help="How long archived messages are kept: 12h, 30d, 8w (default 30d).",
)
@store_option
@json_option
def archive(action: str, retention: str | None, store_url: str | None, as_json: bool) -> None:
    """Turn the store-wide archive on or off, or show it (an operator action for every host).

    On, every relay copies the messages its host sees into the shared store, where anyone who
    can read the store can read them: see docs/archive.md before turning it on.
    """
    from dataclasses import replace

    from crossintercom.storage.connection import connection_url

    cfg = settings()
    url = connection_url(replace(cfg, store_url=store_url or cfg.store_url))
    if not url:
        raise UsageError("no store given: pass --store URL or set CROSSINTERCOM_STORE")
    keep = _retention_s(retention) if retention is not None else None
    if action == "status" and keep is not None:
        raise UsageError("--retention goes with 'on' or 'off'")
    state = asyncio.run(_archive_state(url, None if action == "status" else action == "on", keep))
    if as_json:
        emit_json({"enabled": state.enabled, "retention_s": state.retention_s})
        return
    days = state.retention_s / 86400
    click.echo(f"archive is {'on' if state.enabled else 'off'} (retention {days:g} days)")


async def _archive_state(url: str, enabled: bool | None, keep: int | None) -> ArchiveSettings:
    """The archive setting, set first unless ``enabled`` is None; through the store, whose
    opening checks the schema with its own clear message."""
    from crossintercom.storage import open_store

    store = await open_store(url)
    try:
        if enabled is None:
            return await store.archive.archive_settings()
        return await store.archive.set_archive(enabled=enabled, retention_s=keep)
    finally:
        await store.aclose()


# The store keeps the retention in a 32-bit column (PostgreSQL's integer): about 68 years.
# storage.tables.INTEGER_MAX, written out: importing it loads SQLAlchemy for every `search`.
MAX_RETENTION_S = 2**31 - 1


def _retention_s(text: str) -> int:
    try:
        seconds = parse_age(text)
    except ValueError:
        seconds = 0
    if seconds <= 0:
        raise UsageError(f"--retention {text!r} is not an age such as 12h, 30d or 8w")
    if seconds > MAX_RETENTION_S:
        raise UsageError(
            f"--retention {text!r} is longer than a store keeps: at most "
            f"{MAX_RETENTION_S // 86400}d"
        )
    return seconds


COMMANDS = (search, archive)
