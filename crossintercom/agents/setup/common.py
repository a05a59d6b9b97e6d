"""What every harness's set-up shares: the agent to set up, the planned file changes, and
merging crossintercom's own entries into a user's files without disturbing any other entry
(docs/agents.md#harness-recipes). Each harness's own writer lives in a module beside this
one; ``harnesses`` picks one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from crossintercom.config import (
    ENV_GATEWAY,
    ENV_GATEWAY_CA,
    ENV_GATEWAY_TOKEN_FILE,
    ENV_GROUP,
    ENV_HOME,
    ENV_HOST_ID,
)
from crossintercom.errors import UsageError

SERVER_KEY = "crossintercom"
# The environment variable a harness reads the gateway's token from (docs/agents.md).
TOKEN_ENV = "CROSSINTERCOM_TOKEN"
GATEWAY_ENV = (ENV_GATEWAY, ENV_GATEWAY_TOKEN_FILE, ENV_GATEWAY_CA)
# Only settings that are safe to inherit travel into harness configs; never the store URL,
# which may hold a password and is needed by relays only. A gateway's settings name its URL and
# the files of its token and CA, never the token (docs/agents.md#through-a-gateway).
CARRIED_ENV = (ENV_HOME, ENV_HOST_ID, ENV_GROUP, *GATEWAY_ENV)
# The placeholders of a shipped plugin (script_source), replaced in one pass.
_PLACEHOLDER = re.compile("__COMMAND__|__ENV__|__NAME__|__WAIT_S__|__GATEWAY_POLL__|__GATEWAY__")
# A harness config larger than this is not one setup should rewrite.
MAX_FILE_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class Change:
    path: Path
    before: str | None
    after: str

    @property
    def changed(self) -> bool:
        return self.before != self.after


def default_command() -> list[str]:
    """How a harness should start crossintercom: the installed script, by absolute path."""
    found = shutil.which("crossintercom")
    if found:
        return [str(Path(found).resolve())]
    return [sys.executable, "-m", "crossintercom.cli.main"]


def carried_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ) if environ is None else environ
    carried = {k: environ[k] for k in CARRIED_ENV if environ.get(k)}
    for key, value in carried.items():
        utf8(key, value)
    return carried


def utf8(what: str, value: str) -> str:
    """``value``, refused when it is not UTF-8 text (bytes a harness's file cannot hold)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise UsageError(f"{what} is not UTF-8 text; setup cannot write it") from None
    return value


@dataclass(frozen=True, slots=True)
class Agent:
    name: str
    supervisor: str | None
    command: list[str]
    env: dict[str, str]
    # Let the harness run the server's tools without asking, where it has such a rule.
    allow_tools: bool = True
    # The MCP server's tool profile (docs/agents.md#tool-profiles); None: the server's default.
    profile: str | None = None
    # A gateway's MCP listener (https://HOST:PORT) to reach over HTTP instead of running
    # crossintercom here, and the CA file its certificate is checked against (docs/agents.md).
    gateway: str | None = None
    gateway_ca: str | None = None

    def mcp_args(self) -> list[str]:
        args = ["mcp", "--as", self.name]
        if self.supervisor:
            args += ["--supervisor", self.supervisor]
        return [*args, "--profile", self.profile] if self.profile else args

    def shell(self, *args: str) -> str:
        """A hook command line (hooks run through a shell): env, then the command."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*env, *map(shlex.quote, [*self.command, *args])])

    def wait_command(self, fmt: str, timeout: int) -> str:
        return self.shell("wait", "--as", self.name, "--format", fmt, "--timeout", str(timeout))

    def curl_wait(self, fmt: str, timeout: int) -> str:
        """The wake hook as a ``curl`` long poll of the gateway's ``/wait``: the token from
        ``$CROSSINTERCOM_TOKEN`` goes in on stdin (``-H @-``), never in an argument. The
        answer's first line is a key: only if the hook's parent (the harness, ``$PPID``) is
        still alive and still its parent does it confirm with ``POST /wait/shown?key=KEY``,
        which marks the mail shown; a curl that outlived its harness confirms nothing and the
        mail stays unseen.
        For Claude Code the hand-over goes to stderr and exits 2, as ``wait --format
        claude-hook`` does; nothing, or a gateway not reached, exits 0. The closing comment
        lets setup find its own hook again."""
        assert self.gateway is not None
        base = self.gateway.rstrip("/")
        ca = f" --cacert {shlex.quote(self.gateway_ca)}" if self.gateway_ca else ""
        auth = "printf 'Authorization: Bearer %s\\n' \"$CROSSINTERCOM_TOKEN\" | curl -sS --fail"
        fetch = f"{auth} --max-time {timeout + 60}{ca} -H @- " + shlex.quote(
            f"{base}/wait?format={fmt}&timeout={timeout}"
        )
        confirm = f"{auth} --max-time 30{ca} -H @- -X POST " + shlex.quote(
            f"{base}/wait/shown?key="
        )
        shown = ">&2; exit 2" if fmt == "claude-hook" else "; exit 0"
        marker = f" # crossintercom wait --format {fmt}"
        return (
            f'out=$({fetch}) || exit 0; [ -n "$out" ] || exit 0; '
            "key=$(printf '%s\\n' \"$out\" | head -n 1); "
            'case "$key" in ""|*[!A-Za-z0-9_-]*) exit 0;; esac; '
            'kill -0 "$PPID" 2>/dev/null || exit 0; '
            # Linux: reparented (the harness gone, even as a zombie or its pid reused).
            '[ ! -r /proc/$$/stat ] || [ "$(cut -d" " -f4 /proc/$$/stat)" = "$PPID" ] || exit 0; '
            f'{confirm}"$key" >/dev/null || :; '
            f"printf '%s\\n' \"$out\" | tail -n +2 {shown}" + marker
        )


def script_source(template: str, agent: Agent, wait_s: int) -> str:
    """A harness plugin shipped in this package (``template``), its placeholders filled in as
    JavaScript literals: how to start crossintercom, the env it carries, the name, the wait,
    and the gateway to long-poll instead (its URL and the name of the token's environment
    variable, never the token), or null; and the poll itself (``gateway_poll.js``) as code."""
    here = resources.files("crossintercom.agents.setup")
    text = here.joinpath(template).read_text()
    # Both plugins poll a gateway with the same function, pasted in (each file stands alone).
    poll = here.joinpath("gateway_poll.js").read_text().rstrip("\n")
    values = {
        "__COMMAND__": agent.command,
        "__ENV__": agent.env,
        "__NAME__": agent.name,
        "__WAIT_S__": wait_s,
        "__GATEWAY__": (
            {"url": agent.gateway.rstrip("/"), "tokenEnv": TOKEN_ENV} if agent.gateway else None
        ),
    }
    # One pass: a value holding a placeholder's word is never substituted again.
    return _PLACEHOLDER.sub(
        lambda m: poll if m[0] == "__GATEWAY_POLL__" else json.dumps(values[m[0]]), text
    )


def is_ours(hook: Any, fmt: str) -> bool:
    command = hook.get("command", "") if isinstance(hook, dict) else ""
    return isinstance(command, str) and " wait " in command and f"--format {fmt}" in command


def read_text(path: Path) -> str | None:
    """The file's text, None when there is none; what setup cannot take for a user's config
    (a directory, a FIFO, a huge file, bytes that are not UTF-8) is an error that leaves it
    alone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path} is not a regular file; setup leaves it alone")
        if st.st_size > MAX_FILE_BYTES:
            raise UsageError(f"{path} is larger than {MAX_FILE_BYTES} bytes; setup leaves it alone")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text; setup leaves it alone") from None


def json_object(path: Path, text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except RecursionError:
        raise UsageError(f"{path} nests too deeply; setup leaves it alone") from None
    except ValueError as exc:
        raise UsageError(
            f"{path} is not plain JSON ({exc}); setup leaves it alone. Add the entries "
            "`crossintercom setup ... --print` shows by hand"
        ) from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} does not hold a JSON object; setup leaves it alone")
    return data


def json_change(path: Path, edit: Callable[[dict[str, Any]], None]) -> Change:
    before = read_text(path)
    data = json_object(path, before)
    edit(data)
    after = json.dumps(data, indent=2, ensure_ascii=False)
    if not after.isascii():
        try:
            after.encode()
        except UnicodeEncodeError:  # a lone surrogate the file held as an escape: keep it so
            after = json.dumps(data, indent=2)
    return Change(path, before, after + "\n")


def table(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data[key]``, an object (made when missing); anything else leaves the file alone."""
    found = data.setdefault(key, {})
    if not isinstance(found, dict):
        raise UsageError(f'"{key}" is not an object; setup leaves the file alone')
    return found


def array(data: dict[str, Any], key: str) -> list[Any]:
    """``data[key]``, a list (made when missing); anything else leaves the file alone."""
    found = data.setdefault(key, [])
    if not isinstance(found, list):
        raise UsageError(f'"{key}" is not a list; setup leaves the file alone')
    return found


def stop_hooks(data: dict[str, Any], fmt: str, hook: dict[str, Any], event: str = "Stop") -> None:
    """Replace crossintercom's hook for ``event`` (Stop, SessionStart) in a Claude Code / Codex
    hooks object, keep the rest."""
    hooks = table(data, "hooks")
    groups = [g for g in array(hooks, event) if isinstance(g, dict)]
    kept = []
    for group in groups:
        inner = group.get("hooks", [])
        if isinstance(inner, list) and any(is_ours(h, fmt) for h in inner):
            others = [h for h in inner if not is_ours(h, fmt)]
            if others:
                kept.append({**group, "hooks": others})
        else:
            kept.append(group)
    hooks[event] = [*kept, {"hooks": [hook]}]


def apply(changes: list[Change], root: Path) -> None:
    """Write each changed file whole (through a temporary file, so no reader sees half).

    Nothing is written when a changed file, or a directory between ``root`` (the directory
    setup was given) and it, is a symbolic link: setup never writes out of ``root`` and never
    replaces a user's link with a file."""
    changed = [c for c in changes if c.changed]
    for change in changed:
        _refuse_links(change.path, root)
    for change in changed:
        change.path.parent.mkdir(parents=True, exist_ok=True)
        _write(change.path, change.after)


def _refuse_links(path: Path, root: Path) -> None:
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        parts = (path.name,)
        root = path.parent
    for part in parts:
        root = root / part
        if root.is_symlink():
            raise UsageError(
                f"{root} is a symbolic link; setup writes through no link and leaves it alone. "
                "Add the entries `crossintercom setup ... --print` shows by hand"
            )


def _write(path: Path, text: str) -> None:
    """``text`` into ``path`` by a rename from a new file of a name no one could plant."""
    try:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
    except FileNotFoundError:
        mode = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.crossintercom-tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode())
            if mode is not None:
                os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
