"""Dedup authority files that are not what the broker wrote (docs/delivery.md): each kind of
damage refused with a clear error, then reset aside, readable, with the good state tightened."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crossintercom.errors import AuthorityError
from crossintercom.local_broker.authority.dedup import DecisionKind, DedupAuthority


def _make_authority(directory: Path) -> None:
    with DedupAuthority(directory) as auth:
        for i in range(50):
            auth.lodge(f"m{i}", f"payload {i}".encode())
            auth.accept(f"m{i}", {"id": f"m{i}", "outcome": "delivered"})


def _raw_sql(directory: Path, sql: str, params: tuple[Any, ...] = ()) -> None:
    with contextlib.closing(sqlite3.connect(directory / DedupAuthority.FILE)) as conn:
        conn.execute(sql, params)
        conn.commit()


def _only_key(d: Path) -> None:
    (d / DedupAuthority.FILE).unlink()


def _only_db(d: Path) -> None:
    (d / DedupAuthority.KEY).unlink()


def _short_key(d: Path) -> None:
    key = d / DedupAuthority.KEY
    key.write_bytes(key.read_bytes()[:31])


def _long_key(d: Path) -> None:
    key = d / DedupAuthority.KEY
    key.write_bytes(key.read_bytes() + b"x")


def _loose_key(d: Path) -> None:
    (d / DedupAuthority.KEY).chmod(0o644)


def _key_is_symlink(d: Path) -> None:
    key = d / DedupAuthority.KEY
    real = d / "elsewhere.key"
    key.rename(real)
    key.symlink_to(real)


def _other_key(d: Path) -> None:
    (d / DedupAuthority.KEY).write_bytes(os.urandom(32))


def _garbage_db(d: Path) -> None:
    (d / DedupAuthority.FILE).write_bytes(os.urandom(8192))


def _truncated_db(d: Path) -> None:
    db = d / DedupAuthority.FILE
    os.truncate(db, db.stat().st_size // 2)


def _truncated_header(d: Path) -> None:
    os.truncate(d / DedupAuthority.FILE, 50)


def _empty_db(d: Path) -> None:
    os.truncate(d / DedupAuthority.FILE, 0)


def _foreign_db(d: Path) -> None:
    db = d / DedupAuthority.FILE
    db.unlink()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE notes (x TEXT)")
        conn.commit()


def _extra_table(d: Path) -> None:
    _raw_sql(d, "CREATE TABLE extra (x TEXT)")


def _bad_hmac(d: Path) -> None:
    _raw_sql(d, "INSERT INTO ops VALUES ('bad', 'abc123', 'reserved', NULL, 1e12)")


def _unknown_state(d: Path) -> None:
    _raw_sql(d, "UPDATE ops SET state = 'delivered' WHERE op_id = 'm3'")


def _outcome_not_json(d: Path) -> None:
    _raw_sql(d, "UPDATE ops SET outcome = '{not json' WHERE op_id = 'm4'")


def _outcome_not_object(d: Path) -> None:
    _raw_sql(d, "UPDATE ops SET outcome = '[1, 2]' WHERE op_id = 'm4'")


def _lodged_with_outcome(d: Path) -> None:
    _raw_sql(d, "UPDATE ops SET state = 'reserved' WHERE op_id = 'm5'")


def _bad_expiry(d: Path) -> None:
    _raw_sql(d, "UPDATE ops SET expires_wall = 'soon' WHERE op_id = 'm6'")


def _newer_schema(d: Path) -> None:
    _raw_sql(d, "PRAGMA user_version = 2")


CORRUPTIONS = [
    _only_key,
    _only_db,
    _short_key,
    _long_key,
    _loose_key,
    _key_is_symlink,
    _other_key,
    _garbage_db,
    _truncated_db,
    _truncated_header,
    _empty_db,
    _foreign_db,
    _extra_table,
    _bad_hmac,
    _unknown_state,
    _outcome_not_json,
    _outcome_not_object,
    _lodged_with_outcome,
    _bad_expiry,
    _newer_schema,
]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__.lstrip("_"))
def test_bad_files_refused_then_reset(tmp_path: Path, corrupt: Callable[[Path], None]) -> None:
    _make_authority(tmp_path)
    corrupt(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(AuthorityError) as info:
        DedupAuthority(tmp_path)
    assert info.value.code == "authority_corrupt"
    message = str(info.value)
    assert "crossintercom broker --reset-authority" in message
    assert "delivered-messages." in message
    # Refusing must not repair, replace or remove anything.
    assert sorted(p.name for p in tmp_path.iterdir()) == before

    moved = DedupAuthority.reset(tmp_path)
    assert moved
    assert all(".bad-" in p.name and os.path.lexists(p) for p in moved)
    with DedupAuthority(tmp_path) as auth:
        assert auth.lodge("m1", b"payload 1").kind is DecisionKind.NEW


def test_reset_keeps_the_moved_copy_readable(tmp_path: Path) -> None:
    _make_authority(tmp_path)
    first = DedupAuthority.reset(tmp_path)
    assert {p.name.split(".bad-")[0] for p in first} == {DedupAuthority.FILE, DedupAuthority.KEY}
    assert not (tmp_path / DedupAuthority.FILE).exists()
    assert DedupAuthority.reset(tmp_path) == []
    _make_authority(tmp_path)
    second = DedupAuthority.reset(tmp_path)  # same second: names must not collide
    assert not set(first) & set(second)
    bad_db = next(p for p in first if p.name.startswith(DedupAuthority.FILE))
    with contextlib.closing(sqlite3.connect(bad_db)) as conn:
        assert conn.execute("SELECT count(*) FROM ops").fetchone() == (50,)


def test_stray_wal_without_database_refused(tmp_path: Path) -> None:
    (tmp_path / (DedupAuthority.FILE + "-wal")).write_bytes(b"x")
    with pytest.raises(AuthorityError, match="reset-authority"):
        DedupAuthority(tmp_path)


def test_loose_database_mode_tightened(tmp_path: Path) -> None:
    _make_authority(tmp_path)
    db = tmp_path / DedupAuthority.FILE
    db.chmod(0o644)
    with DedupAuthority(tmp_path):
        assert db.stat().st_mode & 0o777 == 0o600


def test_group_mode(tmp_path: Path) -> None:
    with DedupAuthority(tmp_path, file_mode=0o660):
        pass
    assert (tmp_path / DedupAuthority.KEY).stat().st_mode & 0o777 == 0o660
    with pytest.raises(AuthorityError, match="looser"):
        DedupAuthority(tmp_path)
    with DedupAuthority(tmp_path, file_mode=0o660):
        pass
