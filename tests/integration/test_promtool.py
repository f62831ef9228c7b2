"""The shipped Prometheus rules (deploy/prometheus/ttft-rules.yaml) through Prometheus's own rule engine:
``promtool check rules`` and ``promtool test rules`` on deploy/prometheus/ttft-rules.test.yaml, whose cases
say when each rule fires and when it must stay silent. promtool comes from Debian's ``prometheus`` package
(``make setup``: deploy/prometheus/install.sh); without it these tests fail, never skip."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.promtool

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = PROMETHEUS / "ttft-rules.yaml"
TESTS = PROMETHEUS / "ttft-rules.test.yaml"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool not installed (make setup runs deploy/prometheus/install.sh)", pytrace=False)
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, cwd=PROMETHEUS)


def test_the_rules_file_is_valid_for_prometheus() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_rule_fires_and_stays_silent_as_its_tests_say() -> None:
    result = _promtool("test", "rules", str(TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_shipped_rule_has_a_case_that_fires_and_one_that_does_not() -> None:
    rules = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    cases = [c for t in yaml.safe_load(TESTS.read_text())["tests"] for c in t.get("alert_rule_test", [])]
    for alert in rules:
        mine = [c for c in cases if c["alertname"] == alert]
        assert any(c.get("exp_alerts") for c in mine), f"{alert}: no case where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{alert}: no case where it stays silent"
