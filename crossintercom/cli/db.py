"""`crossintercom db`: create and inspect the shared store's schema."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from crossintercom.config import (
    ENV_STORE,
    ENV_STORE_PASSWORD_FILE,
    ENV_STORE_SSL_CERT,
    ENV_STORE_SSL_KEY,
    ENV_STORE_SSL_ROOT_CERT,
)
from crossintercom.errors import CrossintercomError, UsageError

F = TypeVar("F", bound=Callable[..., Any])

store_option = click.option(
    "--store",
    "store_url",
    envvar=ENV_STORE,
    metavar="URL",
    help=f"postgresql://USER@HOST/DB or sqlite:///PATH (default: ${ENV_STORE})",
)


password_file_option = click.option(
    "--store-password-file",
    "password_file",
    envvar=ENV_STORE_PASSWORD_FILE,
    metavar="PATH",
    help=f"Read the store's password from PATH (env {ENV_STORE_PASSWORD_FILE}); "
    "PGPASSWORD and ~/.pgpass work too.",
)


# The TLS files of a PostgreSQL store (docs/operations.md, "TLS"): keyword -> option, env.
TLS_OPTIONS = (
    (
        "store_ssl_root_cert",
        "--store-ssl-root-cert",
        ENV_STORE_SSL_ROOT_CERT,
        "the CA that signed the server's certificate (sslrootcert; implies sslmode=verify-full)",
    ),
    (
        "store_ssl_cert",
        "--store-ssl-cert",
        ENV_STORE_SSL_CERT,
        "this host's client certificate (sslcert)",
    ),
    (
        "store_ssl_key",
        "--store-ssl-key",
        ENV_STORE_SSL_KEY,
        "the client certificate's key (sslkey; mode 0600)",
    ),
)


def tls_options(f: F) -> F:
    """``--store-ssl-root-cert``, ``--store-ssl-cert`` and ``--store-ssl-key``, each with its
    environment variable; the command receives them as ``store_ssl_*`` keywords."""
    for keyword, flag, env, what in reversed(TLS_OPTIONS):
        f = click.option(flag, keyword, envvar=env, metavar="PATH", help=f"{what} (env {env}).")(f)
    return f


def _require(store_url: str | None, password_file: str | None = None, **tls: str | None) -> str:
    from crossintercom.storage.connection import with_tls_files
    from crossintercom.storage.urls import with_password_file

    if not store_url:
        raise click.UsageError(f"no store given: pass --store URL or set {ENV_STORE}")
    url = with_password_file(store_url, password_file)
    return with_tls_files(
        url,
        root_cert=tls.get("store_ssl_root_cert"),
        cert=tls.get("store_ssl_cert"),
        key=tls.get("store_ssl_key"),
    )


@click.group("db")
def db() -> None:
    """Create and inspect the shared store's schema."""


@db.command()
@store_option
@password_file_option
@tls_options
def upgrade(store_url: str | None, password_file: str | None, **tls: str | None) -> None:
    """Create or upgrade the store's schema to this version (Alembic head)."""
    from crossintercom.storage import migrate, roles
    from crossintercom.storage.poolers import require_own_session
    from crossintercom.storage.urls import mask_url

    url = _require(store_url, password_file, **tls)
    require_own_session(url)  # the migration's advisory lock lives in its session
    revision = migrate.upgrade(url)
    click.echo(f"store {mask_url(url)} is at schema revision {revision} (head)")
    locked = roles.lock_database(url)
    if locked is not None:
        click.echo(locked)


@db.command()
@store_option
@password_file_option
@tls_options
def current(store_url: str | None, password_file: str | None, **tls: str | None) -> None:
    """Print the store's schema revision."""
    from crossintercom.storage import migrate
    from crossintercom.storage.urls import mask_url

    url = _require(store_url, password_file, **tls)
    revision = migrate.current(url)
    head = migrate.head_revision()
    if revision is None:
        click.echo(f"store {mask_url(url)} has no schema; run `crossintercom db upgrade`")
    elif revision == head:
        click.echo(f"{revision} (head)")
    else:
        click.echo(f"{revision} (head is {head}; run `crossintercom db upgrade`)")


@db.command()
@store_option
@password_file_option
@click.option("--json", "as_json", is_flag=True, help="print a JSON object")
def doctor(store_url: str | None, password_file: str | None, as_json: bool) -> None:
    """Schema revision, and what an acknowledgement is worth: synchronous replication or not
    (docs/operations.md, "High availability")."""
    import json

    from crossintercom.storage import migrate
    from crossintercom.storage.replication import replication
    from crossintercom.storage.urls import mask_url, parse_store_url

    url = _require(store_url, password_file)
    revision = migrate.current(url)
    head = migrate.head_revision()
    found = replication(url)
    hosts = parse_store_url(url).hosts if url.startswith("postgresql") else []
    report: dict[str, object] = {
        "store": mask_url(url),
        "hosts": hosts,
        "revision": revision,
        "head": revision == head,
        "replication": found.to_dict(),
    }
    if as_json:
        click.echo(json.dumps(report))
        return
    click.echo(f"store:       {report['store']}")
    if len(hosts) > 1:
        click.echo(f"hosts:       {', '.join(hosts)}")
    state = "(head)" if revision == head else "(run `crossintercom db upgrade`)"
    click.echo(f"schema:      {revision or 'none'} {state}")
    click.echo(f"replication: {found.mode}: {found.says}")
    if found.mode not in ("none", "not postgresql"):
        click.echo(
            f"             {found.standbys} standby(s), {found.synchronous_standbys} synchronous; "
            f"synchronous_standby_names={found.synchronous_standby_names!r}, "
            f"synchronous_commit={found.synchronous_commit}"
        )


@db.command("grant-host")
@click.argument("host_id")
@store_option
@password_file_option
@tls_options
@click.option(
    "--password-stdin",
    is_flag=True,
    help="read the role's password from the first line of stdin (never from the command line)",
)
def grant_host(
    host_id: str,
    store_url: str | None,
    password_file: str | None,
    password_stdin: bool,
    **tls: str | None,
) -> None:
    """Create or update HOST_ID's own database role (PostgreSQL, run as the admin role)."""
    from crossintercom.storage import roles
    from crossintercom.storage.urls import mask_url

    url = _require(store_url, password_file, **tls)
    password = None
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
        if not password:
            raise click.UsageError("--password-stdin: stdin gave an empty password")
    role, locked = roles.grant_host(url, host_id, password)
    click.echo(
        f"host {host_id!r} has database role {role} on {mask_url(url)}; run its relay with "
        f"a store URL that connects as {role}"
    )
    click.echo(locked)


def main(argv: list[str] | None = None) -> int:
    """Run the group on its own, with the error handling the full CLI gives it."""
    try:
        db.main(args=argv, prog_name="crossintercom db", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        return 1
    except CrossintercomError as exc:
        click.echo(f"error: {exc.message}", err=True)
        return UsageError.exit_code if isinstance(exc, UsageError) else exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
