from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from streams.cli.config_cmd import config
from streams.rules import RulesConfig

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "deploy" / "config" / "ttft.yaml"


def test_repo_default_config_holds_the_code_defaults() -> None:
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    assert RulesConfig.model_validate(data["rules"]) == RulesConfig()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(DEFAULT_CONFIG.read_text(), None, id="repo-default"),
        pytest.param("rules: {}\n", None, id="empty-rules"),
        pytest.param("rules:\n  canary:\n    min_samples: 400\n", None, id="override"),
        pytest.param(
            "rules:\n  stage_regression:\n    ratio: 1.2\n    recovery_ratio: 1.3\n",
            "rules.stage_regression: Value error, recovery_ratio must be below ratio",
            id="no-hysteresis",
        ),
        pytest.param("rules:\n  canary:\n    min_sampels: 5\n", "rules.canary.min_sampels: Extra inputs", id="typo"),
        pytest.param(
            "rules:\n  slo_burn:\n    pairs:\n      - {long_windows: 5, short_windows: 60, burn_rate: 9}\n",
            "rules.slo_burn.pairs.0: Value error, short_windows must be below long_windows",
            id="burn-pair",
        ),
        pytest.param(
            "rules:\n  canary:\n    span_windows: 0\n",
            "rules.canary.span_windows: Input should be",
            id="span",
        ),
        pytest.param("windows:\n  grace_s: -5\n", "windows.grace_s: Input should be greater", id="settings-field"),
        pytest.param("tenants:\n  acme:\n    slo_target: 2\n", "tenants.acme.slo_target", id="tenant-override"),
        pytest.param("rulez: {}\n", "rulez: unknown setting", id="unknown-top-level"),
        pytest.param(
            "rules:\n  runbook_base_url: https://github.com/ttft-pipeline/ttft-pipeline/blob/main/docs/runbook.md\n",
            "rules.runbook_base_url: 'https://github.com/ttft-pipeline/ttft-pipeline/blob/main/docs/runbook.md' is "
            "the old placeholder repository URL, not this deployment's: set rules.runbook_base_url to where",
            id="old-default-runbook",
        ),
        pytest.param(
            "rules:\n  runbook_base_url: https://runbooks.example.com/ttft.md\n",
            "rules.runbook_base_url: 'https://runbooks.example.com/ttft.md' is an example host",
            id="example-runbook-host",
        ),
        pytest.param(
            "rules:\n  grafana_url: http://grafana.example\n",
            "rules.grafana_url: 'http://grafana.example'",
            id="grafana",
        ),
        pytest.param("rules:\n  runbook_base_url: file:///srv/ttft/docs/runbook.md\n", None, id="file-runbook"),
        pytest.param("- a\n- b\n", "must hold a mapping", id="not-a-mapping"),
    ],
)
def test_config_check(tmp_path: Path, text: str, expected: str | None) -> None:
    path = tmp_path / "ttft.yaml"
    path.write_text(text)
    result = CliRunner().invoke(config, ["check", str(path)])
    if expected is None:
        assert result.exit_code == 0, result.output
        assert result.output.startswith(f"OK: {path}")
    else:
        assert result.exit_code == 1
        assert expected in result.output


def test_config_check_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(config, ["check", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 1 and "does not exist" in result.output
