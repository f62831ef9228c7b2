"""``ttft otel``: the clear errors that need no Collector, and the port settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from streams.cli.main import main
from streams.settings import OtelCollectorConfig, load_settings


def _env(tmp_path: Path) -> dict[str, str]:
    return {"TTFT_HOME": str(tmp_path), "TTFT_OTELCOL_BIN": str(tmp_path / "no-such-otelcol")}


def test_up_without_binary_says_make_otelcol(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["otel", "up"], env=_env(tmp_path))
    assert result.exit_code == 1
    assert "no-such-otelcol is missing: run `make otelcol`" in result.output


def test_status_and_down_when_nothing_runs(tmp_path: Path) -> None:
    status = CliRunner().invoke(main, ["otel", "status"], env=_env(tmp_path))
    assert status.exit_code == 1 and "not running" in status.output
    down = CliRunner().invoke(main, ["otel", "down"], env=_env(tmp_path))
    assert down.exit_code == 0 and "was not running" in down.output


def test_ports_come_from_env_and_must_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTFT_OTEL__GRPC_PORT", "14317")
    assert load_settings().otel.grpc_port == 14317
    assert load_settings().otel.http_port == 4318
    with pytest.raises(ValidationError, match="must differ"):
        OtelCollectorConfig(grpc_port=4318)
