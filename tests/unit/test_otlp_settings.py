from __future__ import annotations

import pytest
from pydantic import ValidationError

from streams.settings import OtlpConfig, load_settings, settings_summary


def test_defaults_are_the_collectors_topic_and_protobuf() -> None:
    otlp = OtlpConfig()
    assert (otlp.enabled, otlp.topic, otlp.encoding) == (True, "otlp_spans", "otlp_proto")


def test_environment_selects_the_encoding_and_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTFT_OTLP__ENCODING", "otlp_json")
    monkeypatch.setenv("TTFT_OTLP__TOPIC", "spans.from-collector")
    monkeypatch.setenv("TTFT_TOPIC_PREFIX", "prod")
    settings = load_settings()
    assert settings.otlp.encoding == "otlp_json"
    assert settings.otlp.topic == "spans.from-collector"  # never prefixed


@pytest.mark.parametrize(
    "bad",
    [
        {"encoding": "zipkin"},
        {"topic": "has space"},
        {"topic": ""},
        {"max_traces": 0},
        {"max_spans_per_trace": 0},
        {"max_traces_per_tenant": 0},
        {"max_trace_state_bytes": 1_048_576},  # past the producer's batch
        {"max_trace_state_bytes": 4_096},  # below the fixed part of a trace's value
        {"unknown": 1},
    ],
    ids=[
        "encoding",
        "topic-space",
        "topic-empty",
        "max-traces",
        "max-spans",
        "max-traces-per-tenant",
        "state-bytes-high",
        "state-bytes-low",
        "unknown-key",
    ],
)
def test_invalid_otlp_sections_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        OtlpConfig.model_validate(bad)


def test_config_summary_names_the_otlp_input() -> None:
    assert settings_summary(load_settings())["otlp"] == "otlp_spans (otlp_proto)"
    assert settings_summary(load_settings(otlp={"enabled": False}))["otlp"] == "off"
