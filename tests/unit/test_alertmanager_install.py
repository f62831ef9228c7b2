"""``deploy/alertmanager/install.sh`` fails when Alertmanager cannot be installed, and the alerting
fixtures fail (never skip) without it: a broken set-up can no longer pass ``make test``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.alertmanager import require_binary

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "alertmanager" / "install.sh"


def _tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def _run(bin_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The script with only ``bin_dir`` on PATH (fake tools) and a binary path that does not exist."""
    _tool(bin_dir, "id", "echo 1000")
    full = {"PATH": str(bin_dir), "TTFT_ALERTMANAGER_BINARY": str(bin_dir / "missing-alertmanager"), **env}
    return subprocess.run(["/bin/bash", str(SCRIPT)], env=full, capture_output=True, text=True, timeout=30)


def test_install_fails_without_apt(tmp_path: Path) -> None:
    result = _run(tmp_path)
    assert result.returncode == 1, result.stderr
    assert "apt-get not found" in result.stderr


def test_install_fails_when_apt_get_install_fails(tmp_path: Path) -> None:
    _tool(tmp_path, "sudo", 'shift; exec "$@"')
    _tool(tmp_path, "apt-get", 'if [ "$1" = install ]; then exit 100; fi; exit 0')
    result = _run(tmp_path)
    assert result.returncode == 1, result.stderr
    assert "apt-get install prometheus-alertmanager failed (exit 100)" in result.stderr


def test_install_fails_when_the_binary_is_still_missing(tmp_path: Path) -> None:
    _tool(tmp_path, "sudo", 'shift; exec "$@"')
    _tool(tmp_path, "apt-get", "exit 0")
    result = _run(tmp_path)
    assert result.returncode == 1 and "missing after the install" in result.stderr


def test_optional_mode_warns_and_exits_zero(tmp_path: Path) -> None:
    result = _run(tmp_path, TTFT_ALERTMANAGER_OPTIONAL="1")
    assert result.returncode == 0 and "carrying on without Alertmanager" in result.stderr


def test_install_is_a_no_op_when_installed(tmp_path: Path) -> None:
    binary = tmp_path / "am"
    _tool(tmp_path, "am", "exit 0")
    result = _run(tmp_path, TTFT_ALERTMANAGER_BINARY=str(binary))
    assert result.returncode == 0 and result.stderr == ""


def test_fixture_fails_rather_than_skips_without_the_binary() -> None:
    with pytest.raises(pytest.fail.Exception, match="not installed"):
        require_binary(os.path.join("/nonexistent", "prometheus-alertmanager"))
