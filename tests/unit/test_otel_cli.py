"""``ttft otel``: the clear errors that need no Collector, the port settings and the config's defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from streams.cli.main import main
from streams.otel.collector import DEFAULT_CONFIG, LocalCollector
from streams.settings import OtelCollectorConfig, Settings, load_settings


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


def test_collector_config_defaults_are_the_settings_defaults() -> None:
    """deploy/otel/collector.yaml's ``${env:TTFT_OTEL__*:-default}`` and the broker default match Settings,
    and ``LocalCollector`` sets every ``TTFT_OTEL__`` variable the config reads."""
    text = DEFAULT_CONFIG.read_text(encoding="utf-8")
    defaults = dict(re.findall(r"\$\{env:(TTFT_[A-Z_]+):-([^}]*)\}", text))
    settings = Settings()
    ours = {name: value for name, value in defaults.items() if name.startswith("TTFT_OTEL__")}
    # The ports; otel.auth_keys is read by the auth overlay alone (deploy/otel/auth.yaml).
    assert ours == {f"TTFT_OTEL__{k.upper()}": str(v) for k, v in settings.otel.ports().items()}
    assert set(settings.otel.model_dump()) == {*settings.otel.ports(), "auth_keys"}
    assert defaults["TTFT_KAFKA_BOOTSTRAP"] == settings.kafka_bootstrap
    collector = LocalCollector(Path("x"), ports=settings.otel, kafka_bootstrap=settings.kafka_bootstrap)
    assert set(ours) <= set(collector.environment())


def test_up_passes_the_resolved_otlp_topic_and_encoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A TTFT_CONFIG YAML ``otlp:`` section reaches the Collector's environment (TTFT_OTLP__*)."""
    from streams.cli.otel_cmd import _collector

    for name in ("TTFT_OTLP__TOPIC", "TTFT_OTLP__ENCODING"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "ttft.yaml"
    config.write_text("otlp:\n  topic: spans.from-yaml\n  encoding: otlp_json\n")
    monkeypatch.setenv("TTFT_CONFIG", str(config))
    monkeypatch.setenv("TTFT_HOME", str(tmp_path))
    env = _collector(load_settings()).environment()
    assert env["TTFT_OTLP__TOPIC"] == "spans.from-yaml"
    assert env["TTFT_OTLP__ENCODING"] == "otlp_json"
    # The environment still wins over the file, for the worker and the Collector alike.
    monkeypatch.setenv("TTFT_OTLP__TOPIC", "spans.from-env")
    assert _collector(load_settings()).environment()["TTFT_OTLP__TOPIC"] == "spans.from-env"
    monkeypatch.delenv("TTFT_CONFIG")
    monkeypatch.delenv("TTFT_OTLP__TOPIC")
    env = _collector(load_settings()).environment()
    assert (env["TTFT_OTLP__TOPIC"], env["TTFT_OTLP__ENCODING"]) == ("otlp_spans", "otlp_proto")
