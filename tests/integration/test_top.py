from __future__ import annotations

import asyncio
import io
import math
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from rich.console import Console

from streams.core.windows import aggregate_windows
from streams.kafka.topics import kafka_client_kwargs
from streams.rules.model import AlertState, AlertTransition
from streams.settings import Settings
from streams.views.top import TopModel, frame_text
from streams.views.top_feed import run_top
from tests.support.window_records import HOUR_START_MS, WINDOW_MS, synthetic_records

WINDOWS = 6


def _messages(settings: Settings) -> list[tuple[str, bytes, bytes]]:
    """(topic, key, value) exactly as the window closer and the rule engine publish them."""
    records = synthetic_records(3_000, span_ms=WINDOWS * WINDOW_MS, tenants=("acme", "globex"))
    out: list[tuple[str, bytes, bytes]] = []
    opts = orjson.OPT_NON_STR_KEYS
    for ws, agg in aggregate_windows(records, settings).items():
        for row in agg.stage_windows:
            out.append(
                (
                    settings.topic("stage-windows"),
                    f"{row['tenant_id']}|{row['stage']}|{ws}".encode(),
                    orjson.dumps(row, option=opts),
                )
            )
        signals = {(r["tenant_id"], r["version_id"]): r for r in agg.llm_signals}
        tails = {(r["tenant_id"], r["version_id"]): r for r in agg.tail_attribution}
        for row in agg.window_health:
            series = (row["tenant_id"], row["version_id"])
            msg = {**row, "llm_signals": signals.get(series), "tail_attribution": tails.get(series)}
            out.append((settings.topic("window-health"), str(ws).encode(), orjson.dumps(msg, option=opts)))
    labels = {
        "alertname": "TTFTCanaryFailed",
        "tenant": "acme",
        "stage": "llm_ttft",
        "version": "v2",
        "severity": "page",
    }
    at = HOUR_START_MS + WINDOW_MS
    steps: tuple[tuple[AlertState, float | None], ...] = (("pending", None), ("firing", at + WINDOW_MS))
    for state, fired in steps:
        t = AlertTransition("TTFTCanaryFailed", labels, {"summary": "canary v2 is slower"}, {}, state, at, at, fired)
        out.append((settings.topic("alerts"), t.fingerprint.encode(), orjson.dumps(t.to_message())))
    gone = AlertTransition(
        "TTFTSLOBurn",
        {"alertname": "TTFTSLOBurn", "tenant": "globex", "severity": "ticket"},
        {},
        {},
        "resolved",
        at,
        at,
        at,
        at + WINDOW_MS,
    )
    out.append((settings.topic("alerts"), gone.fingerprint.encode(), orjson.dumps(gone.to_message())))
    out.append((settings.topic("alerts"), b"bad", b"{not json"))
    return out


def _expected_ttft_p95(messages: list[tuple[str, bytes, bytes]], tenant: str, first_window: int) -> float:
    bins: dict[int, int] = {}
    zero = 0
    for topic, _key, value in messages:
        if not topic.endswith("stage-windows"):
            continue
        row = orjson.loads(value)
        if row["tenant_id"] == tenant and row["stage"] == "ttft" and row["window_start"] >= first_window:
            for k, n in row["bins"].items():
                bins[int(k)] = bins.get(int(k), 0) + n
            zero += row["zero_count"]
    n = zero + sum(bins.values())
    rank = math.floor(0.95 * (n - 1))
    seen, gamma = zero, 1.01 / 0.99
    for key in sorted(bins):
        seen += bins[key]
        if seen > rank:
            return 2 * gamma**key / (gamma + 1)
    raise AssertionError


async def _produce(settings: Settings, messages: list[tuple[str, bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(acks="all", **kafka_client_kwargs(settings))
    await producer.start()
    try:
        for topic, key, value in messages:
            await producer.send(topic, value=value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


@pytest.mark.kafka
def test_top_once_renders_the_topics(kafka_settings: Settings) -> None:
    messages = _messages(kafka_settings)
    asyncio.run(_produce(kafka_settings, messages))
    console = Console(file=io.StringIO(), width=120)
    frame = asyncio.run(
        asyncio.wait_for(
            run_top(kafka_settings, console=console, span_ms=3 * WINDOW_MS, once=True, live=False), timeout=60
        )
    )
    text = console.file.getvalue()  # type: ignore[attr-defined]

    assert frame.messages == len(messages) - 1 and frame.bad_messages == 1
    assert [p.tenant for p in frame.tenants] == ["acme", "globex"]
    acme = frame.tenants[0]
    first = HOUR_START_MS + (WINDOWS - 3) * WINDOW_MS  # the newest 3 windows
    assert frame.span_start_ms == first
    expected = _expected_ttft_p95(messages, "acme", first)
    assert acme.ttft is not None and acme.ttft.p95 == pytest.approx(expected, rel=1e-12)
    assert acme.slo_ms == kafka_settings.slo_ms("acme")
    assert acme.biggest_p95_stage == "llm_ttft"
    assert acme.cache_hit_rate is not None and 0.2 < acme.cache_hit_rate < 0.6
    assert acme.completeness.total > 0 and set(acme.draft_accept) == {"v1", "v2"}
    assert [a.alertname for a in acme.alerts] == ["TTFTCanaryFailed"] and acme.alerts[0].state == "firing"
    assert frame.tenants[1].alerts == []  # the resolved one is gone

    assert f"TTFT P95 {expected:,.0f} ms vs SLO 2,000 ms" in text and "|" in text
    assert "FIRING TTFTCanaryFailed stage=llm_ttft version=v2 severity=page: canary v2 is slower" in text
    assert "biggest P95: llm_ttft" in text and "retrieval" in text and "#" in text
    assert "globex" in text and "(1 undecodable)" in text


def test_model_replaces_republished_windows_and_prunes() -> None:
    settings = Settings()
    records = synthetic_records(600, span_ms=4 * WINDOW_MS, tenants=("acme",))
    windows = aggregate_windows(records, settings)
    model = TopModel(window_ms=WINDOW_MS, span_ms=2 * WINDOW_MS)
    rows: list[dict[str, Any]] = [r for agg in windows.values() for r in agg.stage_windows]
    for row in rows:
        model.fold("stage-windows", orjson.dumps(row, option=orjson.OPT_NON_STR_KEYS))
    newest = max(windows)
    again = [r for r in rows if r["window_start"] == newest]
    for row in again:  # a replay of the newest window: same key, same version -> replaced, not added
        model.fold("stage-windows", orjson.dumps(row, option=orjson.OPT_NON_STR_KEYS))
    ttft = [r for r in rows if r["stage"] == "ttft" and r["window_start"] >= newest - WINDOW_MS]
    panel = model.frame(settings.slo_ms).tenants[0]
    assert panel.ttft is not None and panel.ttft.count == sum(r["count"] for r in ttft)
    assert {k[3] for k in model.stage_rows} == {newest - WINDOW_MS, newest}
    assert "TTFT P95" in frame_text(model.frame(settings.slo_ms))


@pytest.mark.kafka
def test_top_refresh_loop_plain_and_live(kafka_settings: Settings) -> None:
    asyncio.run(_produce(kafka_settings, _messages(kafka_settings)))
    plain = Console(file=io.StringIO(), width=120)
    frame = asyncio.run(run_top(kafka_settings, console=plain, once=False, duration_s=1.5, interval_s=0.5, live=False))
    text = plain.file.getvalue()  # type: ignore[attr-defined]
    assert [p.tenant for p in frame.tenants] == ["acme", "globex"]
    frames = text.split("ttft top · event time")[1:]
    assert 1 <= len(frames) <= 3  # one per 0.5 s tick at most, and only when the content changed
    assert "acme" in frames[-1] and "globex" in frames[-1] and "FIRING TTFTCanaryFailed" in frames[-1]

    terminal = Console(file=io.StringIO(), width=120, force_terminal=True)
    asyncio.run(run_top(kafka_settings, console=terminal, duration_s=1.0, interval_s=0.5))
    assert "TTFT P95" in terminal.file.getvalue()  # type: ignore[attr-defined]
