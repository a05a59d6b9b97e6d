"""`crossintercom db`: create and inspect the shared store's schema."""

from __future__ import annotations

import sys

import click

from crossintercom.config import ENV_STORE, ENV_STORE_PASSWORD_FILE
from crossintercom.errors import CrossintercomError, UsageError

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


def _require(store_url: str | None, password_file: str | None = None) -> str:
    from crossintercom.storage.urls import with_password_file

    if not store_url:
        raise click.UsageError(f"no store given: pass --store URL or set {ENV_STORE}")
    return with_password_file(store_url, password_file)


@click.group("db")
def db() -> None:
    """Create and inspect the shared store's schema."""


@db.command()
@store_option
@password_file_option
def upgrade(store_url: str | None, password_file: str | None) -> None:
    """Create or upgrade the store's schema to this version (Alembic head)."""
    from crossintercom.storage import migrate, roles
    from crossintercom.storage.urls import mask_url

    url = _require(store_url, password_file)
    revision = migrate.upgrade(url)
    click.echo(f"store {mask_url(url)} is at schema revision {revision} (head)")
    locked = roles.lock_database(url)
    if locked is not None:
        click.echo(locked)


@db.command()
@store_option
@password_file_option
def current(store_url: str | None, password_file: str | None) -> None:
    """Print the store's schema revision."""
    from crossintercom.storage import migrate
    from crossintercom.storage.urls import mask_url

    url = _require(store_url, password_file)
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
@click.option(
    "--password-stdin",
    is_flag=True,
    help="read the role's password from the first line of stdin (never from the command line)",
)
def grant_host(host_id: str, store_url: str | None, password_stdin: bool) -> None:
    """Create or update HOST_ID's own database role (PostgreSQL, run as the admin role)."""
    from crossintercom.storage import roles
    from crossintercom.storage.urls import mask_url

    url = _require(store_url)
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
