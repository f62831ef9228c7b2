"""``ttft otel check`` reading the span topic of the real broker: the captured traces of the three real
instrumentations (tests/data/otel_instrumentations), produced as the Collector's kafkaexporter writes them
(one message per trace, keyed by trace id)."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from schemas.otlp import parse_spans
from streams.kafka.topics import ensure_named_topics
from streams.settings import Settings
from tests.support.pipeline import produce_sync

pytestmark = [pytest.mark.kafka]

DATA = Path(__file__).resolve().parents[1] / "data" / "otel_instrumentations"
LIBRARIES = ("openinference", "openllmetry", "openai_v2")


def _messages(library: str) -> list[bytes]:
    raw = (DATA / f"{library}.otlp").read_bytes()
    out, at = [], 0
    while at < len(raw):
        (size,) = struct.unpack_from(">I", raw, at)
        out.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def test_check_reads_the_last_traces_of_the_span_topic(
    kafka_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streams.cli.main import main

    topic = f"{kafka_settings.topic_prefix}-otlp_spans"
    asyncio.run(ensure_named_topics(kafka_settings, {topic: {}}))
    messages = [m for library in LIBRARIES for m in _messages(library)]
    keyed = [(parse_spans(m, "otlp_proto")[0].trace_id.encode(), m) for m in messages]
    assert produce_sync(kafka_settings.kafka_bootstrap, topic, keyed) == 9
    monkeypatch.setenv("TTFT_KAFKA_BOOTSTRAP", kafka_settings.kafka_bootstrap)
    monkeypatch.setenv("TTFT_OTLP__TOPIC", topic)
    monkeypatch.setenv("TTFT_HOME", str(kafka_settings.home))

    result = CliRunner().invoke(main, ["otel", "check", "--json"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert (doc["traces"], doc["complete"]) == (9, 6)
    scopes = {s["scope"]: s for s in doc["scopes"]}
    assert scopes["opentelemetry.util.genai.handler"]["statuses"] == {"no_first_chunk": 3}
    assert scopes["opentelemetry.util.genai.handler"]["missing"][0]["what"] == "first chunk"

    # The most recent traces by their spans' end: the last library captured.
    ends = {lib: max(s.end_ns for m in _messages(lib) for s in parse_spans(m, "otlp_proto")) for lib in LIBRARIES}
    latest = max(ends, key=ends.__getitem__)
    result = CliRunner().invoke(main, ["otel", "check", "--json", "--traces", "3"])
    doc = json.loads(result.stdout)
    assert doc["traces"] == 3 and len(doc["scopes"]) == 1
    assert result.exit_code == (1 if latest == "openai_v2" else 0)
    assert doc["unkeyed_messages"] == 0


def test_check_says_when_messages_are_not_keyed_by_their_trace_id(
    kafka_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Collector's kafka exporter without ``partition_traces_by_id: true`` sends unkeyed messages: a trace's
    spans can then reach different join workers. The check names the setting."""
    from streams.cli.main import main

    topic = f"{kafka_settings.topic_prefix}-otlp_unkeyed"
    asyncio.run(ensure_named_topics(kafka_settings, {topic: {}}))
    messages = _messages("openinference")
    keyed = [(None, m) for m in messages[:2]] + [
        (parse_spans(messages[2], "otlp_proto")[0].trace_id.encode(), messages[2])
    ]
    assert produce_sync(kafka_settings.kafka_bootstrap, topic, keyed) == 3
    monkeypatch.setenv("TTFT_KAFKA_BOOTSTRAP", kafka_settings.kafka_bootstrap)
    monkeypatch.setenv("TTFT_OTLP__TOPIC", topic)
    monkeypatch.setenv("TTFT_HOME", str(kafka_settings.home))

    doc = json.loads(CliRunner().invoke(main, ["otel", "check", "--json"]).stdout)
    assert (doc["traces"], doc["complete"], doc["unkeyed_messages"]) == (3, 3, 2)
    text = CliRunner().invoke(main, ["otel", "check"]).output
    assert "2 of 3 messages are not keyed by their trace id" in text and "partition_traces_by_id: true" in text
