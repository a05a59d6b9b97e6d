"""What each host's relay writes of itself into its own hosts row (its version at its claim, its
last error when that changes) and how `status --all-hosts` reads it: as another host's words,
checked for type and size when read and neutralised when shown. On both stores, and against
a hostile writer: a host role on PostgreSQL, any writer of the file on SQLite."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from crossintercom.config import Settings
from crossintercom.errors import StoreUnavailable
from crossintercom.relay.core import RelayCore
from crossintercom.storage import HostReport, MailboxStore, open_store
from crossintercom.storage.blocking import run
from crossintercom.storage.roles import grant_host
from crossintercom.storage.tables import ERROR_CHARS
from tests.conftest import make_env, run_cli
from tests.hostroles import drop_host_roles, role_url
from tests.pgharness import PgServer

PASSWORD = "r3port-r0le"
TEN_MB = 10 * 1024 * 1024
# What a hostile host would like a person's terminal to run or show: a colour, a title, a
# cursor move, a bidi override and a bell.
HOSTILE = "\x1b[31mFAKE\x1b]0;owned\x07\x1b[2J\u202egnp.exe\x07 done"


def _reports(store: MailboxStore) -> dict[str, HostReport | None]:
    return {h.host_id: h.report for h in run(store.hosts(reports=True))}


def test_version_at_the_claim_and_the_last_error_when_written(store: MailboxStore) -> None:
    gen = run(store.claim_host("h1", "machine-1", "1.2.3"))
    run(store.claim_host("h2"))
    got = {h.host_id: h.report for h in run(store.hosts(reports=True))}
    assert got["h1"] is not None and got["h1"].version == "1.2.3"
    assert got["h1"].error_code is None and got["h1"].error_age_s is None
    assert got["h2"] is not None and got["h2"].version is None
    # Without ``reports`` the lease read stays as it was: nothing of what hosts wrote.
    assert all(h.report is None for h in run(store.hosts()))

    assert run(store.record_error("h1", gen, "store_unavailable", "connection refused"))
    r = {h.host_id: h.report for h in run(store.hosts(reports=True))}["h1"]
    assert r is not None
    assert (r.error_code, r.error, r.unreadable) == ("store_unavailable", "connection refused", ())
    assert r.error_age_s is not None and 0 <= r.error_age_s < 60
    # A stale generation writes nothing (a relay fenced out).
    assert run(store.claim_host("h1", "machine-1", "1.2.4")) == gen + 1
    assert not run(store.record_error("h1", gen, "internal", "late"))
    r = {h.host_id: h.report for h in run(store.hosts(reports=True))}["h1"]
    assert r is not None and r.version == "1.2.4" and r.error == "connection refused"
    # A claim naming no machine keeps the one recorded.
    assert run(store.host_claim("h1")) == ("machine-1", 0)


def test_the_relay_writes_its_error_only_when_it_changes(store_url: str, tmp_path: Path) -> None:
    """The relay's observer keeps the last store error (masked, one line, bounded); the row is
    written once per change: the same error again, or none, writes nothing."""
    settings = Settings(home=tmp_path, host_id="h1", heartbeat_s=0.05)

    async def scenario() -> list[tuple[str, str | None]]:
        store = await open_store(store_url)
        writes: list[tuple[str, str | None]] = []
        try:
            core = RelayCore(settings, store)
            core.generation = await store.claim_host("h1")
            record = store.record_error

            async def counted(host: str, gen: int, code: str, error: str) -> bool:
                writes.append((code, error))
                return await record(host, gen, code, error)

            store.record_error = counted  # type: ignore[method-assign, assignment]
            task = asyncio.get_running_loop().create_task(core.record_errors())
            leak = "postgresql://relay:s3cret-pw@db.example/mail"
            said = StoreUnavailable(f"store unreachable: {leak}\nconnection refused " + "x" * 500)
            for _ in range(5):
                core.store_operation("beat", 0.01, said)
                core.store_operation("beat", 0.01, None)
            while not writes:
                await asyncio.sleep(0.01)
            # Many heartbeats' time with the same error and with none: nothing more written.
            await asyncio.sleep(settings.heartbeat_s * 6)
            assert len(writes) == 1
            core.store_operation("ack", 0.01, StoreUnavailable("lock timeout"))
            while len(writes) < 2:
                await asyncio.sleep(0.01)
            core.stopping.set()
            core._error_changed.set()
            await task
            reports = {h.host_id: h.report for h in await store.hosts(reports=True)}
            r = reports["h1"]
            assert r is not None
            assert (r.error_code, r.error) == ("store_unavailable", "lock timeout")
        finally:
            await store.aclose()
        return writes

    writes = asyncio.run(scenario())
    code, first = writes[0]
    assert code == "store_unavailable" and first is not None
    assert "s3cret-pw" not in first and "***" in first
    assert "\n" not in first and len(first) <= ERROR_CHARS


def _status(store_url: str, tmp_path: Path) -> tuple[dict[str, dict[str, Any]], str]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    env = make_env(home, CROSSINTERCOM_STORE=store_url, COLUMNS="300")
    out = run_cli(env, "status", "--all-hosts", "--json")
    assert out.returncode == 0, out.stderr
    text = run_cli(env, "status", "--all-hosts")
    assert text.returncode == 0, text.stderr
    for shown in (out.stdout, text.stdout):
        assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    return {h["host_id"]: h for h in json.loads(out.stdout)["hosts"]}, text.stdout


def test_a_hostile_sqlite_writer_gets_nothing_past_the_read(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Any writer of the file may store any type and length: 10 MB of text, a BLOB, text that
    is not UTF-8, control characters. Each is refused by itself when read (named as
    unreadable), or shown neutralised; the rest of the row and the other hosts stay."""
    store = run(open_store(sqlite_url))
    try:
        for host in ("big", "blob", "badutf8", "escapes", "fine"):
            gen = run(store.claim_host(host, None, "0.1.0"))
        run(store.record_error("fine", gen, "store_unavailable", "refused"))
    finally:
        run(store.aclose())
    db = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    with db:
        big = "E" * TEN_MB
        db.execute(
            "UPDATE hosts SET last_error = ?, last_error_code = ?, version = ?, last_error_at = ? "
            "WHERE host_id = 'big'",
            (big, "c" * TEN_MB, "9" * TEN_MB, "2" * TEN_MB),
        )
        db.execute(
            "UPDATE hosts SET last_error = ?, last_error_code = ?, version = ?, last_error_at = ? "
            "WHERE host_id = 'blob'",
            (b"\x00\xff\x1b[31m", b"\xfe", b"\x00", b"\xff\xfe"),
        )
        db.execute(
            "UPDATE hosts SET last_error = CAST(? AS TEXT), version = CAST(? AS TEXT) "
            "WHERE host_id = 'badutf8'",
            (b"caf\xe9", b"1.\xff"),
        )
        db.execute(
            "UPDATE hosts SET last_error = ?, last_error_code = ?, version = ?, "
            "last_error_at = CURRENT_TIMESTAMP WHERE host_id = 'escapes'",
            (HOSTILE, "x\x1b[0m", "1.0\x1b[2J"),
        )
    db.close()

    store = run(open_store(sqlite_url))
    try:
        got = _reports(store)
    finally:
        run(store.aclose())
    big_r, blob, bad, esc, fine = (got[h] for h in ("big", "blob", "badutf8", "escapes", "fine"))
    assert big_r is not None and big_r.error is None and big_r.version is None
    assert set(big_r.unreadable) == {"version", "error_code", "last_error", "error_at"}
    assert blob is not None and (blob.error, blob.error_code, blob.version) == (None, None, None)
    assert set(blob.unreadable) == {"version", "error_code", "last_error", "error_at"}
    assert bad is not None and set(bad.unreadable) == {"version", "last_error"}
    # Text of its bound, but not of its form: the version and code are refused; the message is
    # any one line and is kept, to be neutralised where it is shown.
    assert esc is not None and esc.version is None and esc.error_code is None
    assert esc.error == HOSTILE and set(esc.unreadable) == {"version", "error_code"}
    assert fine is not None and fine.error == "refused" and fine.unreadable == ()

    hosts, text = _status(sqlite_url, tmp_path)
    assert hosts["escapes"]["last_error"] == {
        "code": None,
        "message": "FAKEgnp.exe done",
        "age_s": hosts["escapes"]["last_error"]["age_s"],
    }
    assert hosts["fine"]["version"] == "0.1.0"
    assert hosts["big"]["version"] is None and "version" in hosts["big"]["unreadable"]
    assert "FAKEgnp.exe done" in text and "(unreadable)" in text


@pytest.fixture
def two_roles(pg_server: PgServer, pg_url: str) -> Iterator[tuple[str, str, str, str]]:
    """Hosts A and B with a role each, both claimed: A's host and role URL, B's."""
    suffix = uuid.uuid4().hex[:6]
    roles: list[str] = []
    out: list[str] = []
    try:
        for name in ("A", "B"):
            host = f"{name}-{suffix}"
            role, _ = grant_host(pg_url, host, PASSWORD)
            roles.append(role)
            url = role_url(pg_url, role, PASSWORD)
            store = run(open_store(url))
            try:
                run(store.claim_host(host, "m", "0.2.0"))
            finally:
                run(store.aclose())
            out += [host, url]
        yield out[0], out[1], out[2], out[3]
    finally:
        drop_host_roles(pg_server, roles, pg_url)


@pytest.mark.pg
def test_a_hostile_host_role_writes_only_bounded_text_into_its_own_row(
    pg_url: str, two_roles: tuple[str, str, str, str], tmp_path: Path
) -> None:
    a, a_url, b, _ = two_roles
    libpq = a_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(libpq, autocommit=True) as conn:
        # Past the columns' bounds: the server refuses the value.
        for column in ("last_error", "last_error_code", "version"):
            with pytest.raises(psycopg.errors.StringDataRightTruncation):
                conn.execute(
                    f"UPDATE public.hosts SET {column} = repeat('x', {TEN_MB}) WHERE host_id = %s",
                    (a,),
                )
        # Binary: a NUL is no text PostgreSQL keeps; bytes that are not UTF-8 neither.
        with pytest.raises(psycopg.DataError):
            conn.execute(
                "UPDATE public.hosts SET last_error = %s WHERE host_id = %s", ("a\x00b", a)
            )
        with pytest.raises(psycopg.DataError):
            conn.execute(
                "UPDATE public.hosts SET last_error = convert_from('\\xff'::bytea, 'UTF8') "
                "WHERE host_id = %s",
                (a,),
            )
        # Another host's row: nothing, whichever column.
        for column in ("last_error", "version", "last_error_at"):
            value = "now()" if column == "last_error_at" else "'forged'"
            stmt = f"UPDATE public.hosts SET {column} = {value} WHERE host_id = %s"
            assert conn.execute(stmt, (b,)).rowcount == 0
        # Its own row: any bounded text, control characters too, and any time.
        conn.execute(
            "UPDATE public.hosts SET last_error = %s, last_error_code = %s, version = %s, "
            "last_error_at = now() + interval '1 day' WHERE host_id = %s",
            (HOSTILE, "bad code!", "1.0\x1b[2J", a),
        )
    hosts, text = _status(pg_url, tmp_path)
    assert hosts[b]["version"] == "0.2.0" and hosts[b]["last_error"] is None
    assert hosts[a]["version"] is None and set(hosts[a]["unreadable"]) == {"version", "error_code"}
    error = hosts[a]["last_error"]
    assert isinstance(error, dict) and error["message"] == "FAKEgnp.exe done"
    assert error["code"] is None and error["age_s"] == 0.0  # a time to come reads as now
    assert "FAKEgnp.exe done" in text
