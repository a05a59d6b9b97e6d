"""Path reservations from a session (docs/agents.md#path-reservations): reserve, release and
list them through the broker, which asks its relay and so the shared store; and the project
key that lets checkouts of one repository on different machines share them."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crossintercom import protocol as p
from crossintercom.client.aio import AsyncClient
from crossintercom.client.connection import expect
from crossintercom.errors import UsageError
from crossintercom.reservations import Held, Mode

# scp-like ssh ("git@host:org/repo.git"): no scheme, a colon before the first slash.
_SCP = re.compile(r"^(?:[^@/]+@)?([^:/]+):(?!//)(.*)$")
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://(?:[^@/]*@)?([^/:]+)(?::\d*)?(/.*)?$")


def normalise_remote(url: str) -> str:
    """One key for every way of naming a repository: ``host/path`` with the host in lower case,
    without user, port, scheme, trailing ``/`` or ``.git``; so the ssh and https remotes of one
    repository give the same key. A local path stays a path."""
    u = url.strip()
    found = _URL.match(u)
    if found:
        host, path = found.group(1).lower(), found.group(2) or ""
    elif (scp := _SCP.match(u)) is not None and not Path(u).exists():
        host, path = scp.group(1).lower(), scp.group(2)
    else:
        return u.removeprefix("file://").rstrip("/").removesuffix(".git")
    path = path.rstrip("/").removesuffix(".git").strip("/")
    return f"{host}/{path}"


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def repo_top(cwd: Path | None = None) -> Path | None:
    """The top directory of the git checkout around ``cwd``, None outside one."""
    top = _git(cwd or Path.cwd(), "rev-parse", "--show-toplevel")
    return Path(top) if top else None


def project_key(project: str | None = None, cwd: Path | None = None) -> str:
    """``project`` when given; else the checkout's ``origin`` remote, normalised; else the name
    of the checkout's top directory. ``UsageError`` outside a checkout with no ``project``."""
    if project is not None:
        if not project.strip():
            raise UsageError("a project key is not empty")
        return project.strip()
    here = cwd or Path.cwd()
    top = repo_top(here)
    if top is None:
        raise UsageError(
            f"{here} is not in a git checkout: give --project NAME (the same on every machine)"
        )
    remote = _git(here, "remote", "get-url", "origin")
    return normalise_remote(remote) if remote else top.name


def repo_paths(paths: Sequence[str], cwd: Path | None = None) -> list[str]:
    """``paths`` (as typed, relative to ``cwd``) relative to the checkout's top directory; as
    given outside a checkout."""
    here = (cwd or Path.cwd()).resolve()
    top = repo_top(here)
    out = []
    for raw in paths:
        if top is None:
            out.append(raw.removeprefix("./"))
            continue
        full = Path(raw) if Path(raw).is_absolute() else here / raw
        try:
            out.append(Path(_resolved(full)).relative_to(top.resolve()).as_posix())
        except ValueError:
            raise UsageError(f"{raw} is outside the checkout {top}") from None
    return out


def _resolved(path: Path) -> str:
    # Without following a final symlink: a hook names what git names.
    return str(path.parent.resolve() / path.name)


async def reserve(
    client: AsyncClient,
    project: str,
    globs: Sequence[str],
    mode: Mode = "exclusive",
    ttl_s: float = 3600.0,
    reason: str | None = None,
) -> p.ReservationList:
    """Reserve ``globs`` for this session, all or none: a clash answers with ``code``
    ``reservation_conflict`` and the ``conflicts``, and nothing is reserved."""
    frame = p.Reserve(0, project, list(globs), mode, ttl_s, reason)
    return expect(await client.request(frame), p.ReservationList)


async def unreserve(
    client: AsyncClient, project: str, globs: Sequence[str] | None = None
) -> p.ReservationList:
    """Release this session's reservations of ``project`` (``globs`` None: all)."""
    frame = p.Unreserve(0, project, None if globs is None else list(globs))
    return expect(await client.request(frame), p.ReservationList)


async def reservations(client: AsyncClient, project: str | None = None) -> p.ReservationList:
    """Every host's live reservations of ``project`` (None: of every project)."""
    return expect(await client.request(p.Reservations(0, project)), p.ReservationList)


def held(r: p.Reservation) -> Held:
    mode: Mode = "shared" if r.mode == "shared" else "exclusive"
    return Held(
        r.id, r.project, r.glob, mode, r.host, r.session, r.expires_at, r.created, r.reason, r.name
    )


def reservation_json(r: p.Reservation, now: float | None = None) -> dict[str, Any]:
    """The CLI's, the MCP tools' and the page's shape of one reservation."""
    left = r.expires_at - (time.time() if now is None else now)
    return {
        "id": r.id,
        "project": r.project,
        "glob": r.glob,
        "mode": r.mode,
        "holder": f"{r.name or r.session}@{r.host}",
        "session": r.session,
        "host": r.host,
        "reason": r.reason,
        "created": r.created,
        "expires_at": r.expires_at,
        "expires_in_s": max(0, round(left)),
    }


def reservation_line(r: p.Reservation) -> str:
    """One reservation for people (the caller neutralises it for its surface)."""
    left = int(max(0.0, r.expires_at - time.time()))
    ttl = f"{left // 3600}h{left % 3600 // 60:02d}m" if left >= 3600 else f"{left // 60}m"
    why = f": {r.reason}" if r.reason else ""
    return f"{r.glob} {r.mode} by {r.name or r.session}@{r.host}, {ttl} left{why}"
