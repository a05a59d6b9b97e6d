"""The systemd units in deploy/: checked with `systemd-analyze verify` when it is available.

Every ``deploy/*.service`` is checked (none at all is a failure). The unit's ExecStart binary is
where an installation puts it (/usr/local/bin, ~/.local/bin), which a test machine may not have:
when that path does not exist, the copy that is verified points at this checkout's
``crossintercom`` script instead; everything else is verified as written. ``verify`` exits 0 on
unknown keys and bad values (it only warns), so any line naming the unit file fails the test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
UNITS = sorted(DEPLOY.glob("*.service"))
RELAY_UNITS = [u for u in UNITS if "relay" in u.name]
ANALYZE = shutil.which("systemd-analyze")


def test_deploy_has_units() -> None:
    assert UNITS, f"no systemd unit files (*.service) in {DEPLOY}"


def _is_user_unit(text: str, path: Path) -> bool:
    return "user" in path.name or re.search(r"^WantedBy=default\.target", text, re.M) is not None


def _installed_script() -> Path:
    script = Path(sys.executable).parent / "crossintercom"
    assert script.exists(), f"{script} missing: install the package into this interpreter"
    return script


def _local_copy(unit: Path, dest: Path) -> tuple[Path, str]:
    """The unit as verified here, with an absent ExecStart binary pointed at this checkout."""
    text = unit.read_text()
    home = str(Path.home())

    def swap(m: re.Match[str]) -> str:
        prefix, binary = m.group(1), m.group(2)
        if Path(binary.replace("%h", home)).exists():
            return m.group(0)
        return f"ExecStart={prefix}{_installed_script()}"

    patched = re.sub(r"^ExecStart=([-@:+!]*)(\S+)", swap, text, flags=re.M)
    out = dest / unit.name
    out.write_text(patched)
    return out, text


@pytest.mark.parametrize("unit", RELAY_UNITS, ids=[u.name for u in RELAY_UNITS])
def test_unit_runs_the_relay_with_restart_and_env_file(unit: Path) -> None:
    text = unit.read_text()
    exec_start = re.search(r"^ExecStart=(.*)$", text, re.M)
    assert exec_start is not None, f"{unit.name}: no ExecStart"
    assert re.search(r"\bcrossintercom\s+relay\b", exec_start.group(1)), exec_start.group(1)
    assert re.search(r"^Restart=(always|on-failure|on-abnormal)$", text, re.M), "no restart policy"
    assert re.search(r"^EnvironmentFile=", text, re.M), "no environment file"
    assert re.search(r"^\[Install\]", text, re.M), "not installable (no [Install] section)"
    # Ready only once it can deliver, and restarted when its event loop hangs (relay/systemd.py).
    assert re.search(r"^Type=notify$", text, re.M), "not Type=notify"
    assert re.search(r"^NotifyAccess=main$", text, re.M), "NotifyAccess is not main"
    assert re.search(r"^WatchdogSec=\d+", text, re.M), "no watchdog"


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_analyze_verify(unit: Path, tmp_path: Path) -> None:
    if ANALYZE is None:
        # .ci/run installs systemd's analyzer; elsewhere a machine without it skips.
        if os.environ.get("CROSSINTERCOM_REQUIRE_OPS_TOOLS"):
            pytest.fail("systemd-analyze is not installed (Debian: apt-get install systemd)")
        pytest.skip("systemd-analyze is not installed")
    copy, text = _local_copy(unit, tmp_path)
    cmd = [ANALYZE, "verify", "--man=no"]
    env = dict(os.environ)
    if _is_user_unit(text, unit):
        runtime = tmp_path / "xdg-runtime"
        runtime.mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(runtime)  # a user manager needs one, even offline
        cmd.append("--user")
    out = subprocess.run(
        [*cmd, str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    output = out.stdout + out.stderr
    assert out.returncode == 0, output
    complaints = [line for line in output.splitlines() if unit.name in line]
    assert not complaints, "\n".join(complaints)
