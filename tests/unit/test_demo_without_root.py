"""`make demo` on a machine without root (issue 29): an install script that cannot install says so in one line
and the demo's set-up goes on (`make test`'s stays strict); without Alertmanager the writer's alerts go
straight to the demo's own webhook receiver. The scripts are forced to fail with fake tools on PATH."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from streams.alerting.alertmanager import AlertmanagerClient, alertmanager_alert
from streams.demo.alerting import WebhookRecorder
from streams.demo.run import _paged
from streams.rules.model import AlertTransition

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = {
    "alertmanager": (REPO / "deploy/alertmanager/install.sh", "TTFT_ALERTMANAGER_OPTIONAL", "TTFT_ALERTMANAGER_BINARY"),
    "kcat": (REPO / "deploy/kcat/install.sh", "TTFT_KCAT_OPTIONAL", "TTFT_KCAT_BINARY"),
    "promtool": (REPO / "deploy/prometheus/install.sh", "TTFT_PROMTOOL_OPTIONAL", "TTFT_PROMTOOL_BINARY"),
}
#: Real tools the scripts and the Makefile's own $(shell ...) lines use; everything else is absent or fake.
REAL_TOOLS = ("bash", "env", "cat", "sha1sum", "cut", "rm", "chmod", "printf")


def no_root_machine(bin_dir: Path, *, sudo: bool, apt: bool) -> dict[str, str]:
    """An environment whose PATH has the real basics, ``id -u`` = 1000, and sudo / apt-get as asked: sudo
    that needs a password (``-n`` fails), apt-get that fails to install."""
    bin_dir.mkdir(exist_ok=True)
    for tool in REAL_TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)

    def fake(name: str, body: str) -> None:
        (bin_dir / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (bin_dir / name).chmod(0o755)

    fake("id", "echo 1000")
    if sudo:
        fake("sudo", 'echo "sudo: a password is required" >&2; exit 1')
    if apt:
        fake("apt-get", "exit 100")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTFT_")}
    env["PATH"] = str(bin_dir)
    for _, _, binary_var in SCRIPTS.values():
        env[binary_var] = str(bin_dir / "not-installed")
    return env


@pytest.mark.parametrize("tool", sorted(SCRIPTS))
@pytest.mark.parametrize(
    ("sudo", "apt", "reason"),
    [
        (False, False, "apt-get not found"),
        (False, True, "not root and no sudo"),
        (True, True, "not root and sudo needs a password"),
    ],
    ids=["no-apt", "no-sudo", "sudo-password"],
)
def test_a_script_that_cannot_install_fails_or_says_one_line(
    tmp_path: Path, tool: str, sudo: bool, apt: bool, reason: str
) -> None:
    script, optional_var, _ = SCRIPTS[tool]
    env = no_root_machine(tmp_path / "bin", sudo=sudo, apt=apt)
    strict = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert strict.returncode == 1 and reason in strict.stderr, strict.stderr  # make test stops here
    optional = subprocess.run([str(script)], env={**env, optional_var: "1"}, capture_output=True, text=True, timeout=30)
    lines = (optional.stdout + optional.stderr).splitlines()
    assert optional.returncode == 0 and len(lines) == 1, lines
    assert "not installed" in lines[0] and reason in lines[0] and "carrying on without" in lines[0]


def _make(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    assert make, "make"
    # venv, native and kafka-jars are taken as done: this is about what the demo does with the tools it lacks.
    done = ["-o", "venv", "-o", "native", "-o", "kafka-jars", "-o", ".venv/bin/ttft"]
    return subprocess.run(
        [make, "--no-print-directory", *done, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def test_make_demo_setup_goes_on_without_alertmanager_in_one_line(tmp_path: Path) -> None:
    env = no_root_machine(tmp_path / "bin", sudo=True, apt=True)
    result = _make(env, "demo-setup")
    lines = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 0, lines
    assert lines == [
        "prometheus-alertmanager not installed (not root and sudo needs a password; cannot install "
        "prometheus-alertmanager): carrying on without Alertmanager"
    ]


def test_make_demo_needs_no_kcat_and_make_test_stays_strict(tmp_path: Path) -> None:
    env = no_root_machine(tmp_path / "bin", sudo=True, apt=True)
    demo = _make(env, "-n", "demo").stdout
    assert "TTFT_ALERTMANAGER_OPTIONAL=1 deploy/alertmanager/install.sh" in demo and "kcat" not in demo
    assert "promtool" not in demo and "prometheus/install" not in demo
    setup = _make(env, "-n", "setup").stdout
    assert "deploy/alertmanager/install.sh" in setup and "deploy/kcat/install.sh" in setup
    assert "deploy/prometheus/install.sh" in setup
    assert "OPTIONAL" not in setup
    strict = _make(env, "alertmanager")
    assert strict.returncode != 0 and "error: not root and sudo needs a password" in strict.stderr


def _transition(state: str) -> AlertTransition:
    return AlertTransition(
        alertname="TTFTCanaryFailed",
        labels={"alertname": "TTFTCanaryFailed", "tenant": "acme", "stage": "llm_ttft", "severity": "page"},
        annotations={"summary": "canary v13 fails"},
        numbers={"ratio": 1.4},
        state=state,  # type: ignore[arg-type]
        window_start=0.0,
        active_at=0.0,
        fired_at=0.0 if state != "pending" else None,
        resolved_at=60_000.0 if state == "resolved" else None,
    )


@pytest.mark.net
def test_without_alertmanager_the_writers_posts_reach_the_demo_webhook() -> None:
    seen: list[dict[str, object]] = []
    webhook = WebhookRecorder(on_alert=seen.append)
    try:
        now = datetime.now(UTC)

        async def deliver() -> list[bool]:
            async with AlertmanagerClient(webhook.api_url) as client:  # what TTFT_ALERTMANAGER_URL points at
                firing = alertmanager_alert(_transition("firing"), now=now, ends_in=timedelta(minutes=5))
                resent = alertmanager_alert(_transition("firing"), now=now, ends_in=timedelta(minutes=5))
                resolved = alertmanager_alert(
                    _transition("resolved"), now=now - timedelta(seconds=1), ends_in=timedelta(minutes=5)
                )
                return [await client.post([firing]), await client.post([resent]), await client.post([resolved])]

        assert asyncio.run(deliver()) == [True, True, True]
        assert [a["status"] for a in webhook.alerts()] == ["firing", "firing", "resolved"]
        assert _paged(webhook) == ["TTFTCanaryFailed tenant=acme stage=llm_ttft severity=page"]
        assert all(a.get("direct") for a in seen)
    finally:
        webhook.close()
