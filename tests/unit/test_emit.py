"""The emitter (the ttft-emit distribution, emitter/) against the pipeline's contract: what it buffers is what
schemas/decode.py accepts. Its own behaviour (buffer, drops, retries, threads) is tested in emitter/tests."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import orjson
import pytest
import ttft_emit

import streams.emit
from schemas.decode import decode_stage_event
from schemas.events import StageEvent
from streams.emit import StageEmitter, ThreadedStageEmitter, event_json
from streams.settings import CapsConfig

WALL0 = 1_761_300_000.0  # seconds, as time.time() returns


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def closed_port() -> Iterator[int]:
    # Bind then close: nothing listens, so a connect is refused at once (loopback only).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    yield port


def _emitter(port: int, **kwargs: object) -> StageEmitter:
    options: dict[str, object] = {
        "tenant_id": "acme",
        "version_id": "v1",
        "route": "main",
        "stop_timeout_s": 0.5,
    }
    options.update(kwargs)
    return StageEmitter(f"127.0.0.1:{port}", **options)  # type: ignore[arg-type]


def _decoded(emitter: StageEmitter) -> list[StageEvent]:
    events = []
    for key, value in emitter.buffered():
        event = decode_stage_event(value, key, "ttft.stage-events", 0, 0, None, CapsConfig(), 9e12)
        assert isinstance(event, StageEvent), event
        events.append(event)
    return events


@pytest.mark.net
def test_spans_use_the_monotonic_clock_and_instants_share_it(closed_port: int) -> None:
    async def scenario() -> None:
        mono = FakeMonotonic()
        wall = [WALL0]
        emitter = _emitter(closed_port, wall_clock=lambda: wall[0], monotonic_clock=mono, rollout="canary")
        await emitter.start()
        req = emitter.request("r-1", tenant_id='租户 "q"', fallback_level=1)
        req.request_start()
        mono.now += 0.25
        wall[0] -= 3600  # an NTP step backwards must not bend this request's times
        async with req.stage("retrieval", attrs={"rerank_top_k": 5}):
            mono.now += 0.4125
        mono.now += 1.0
        req.first_token()
        req.record("llm_ttft", req.now_ms() - 900, 880.5)
        events = _decoded(emitter)
        start, retrieval, first, llm = events
        assert start.ts_ms == WALL0 * 1000
        assert retrieval.ts_ms == WALL0 * 1000 + 250
        assert retrieval.duration_ms == pytest.approx(412.5)
        assert first.ts_ms == pytest.approx(WALL0 * 1000 + 1662.5)
        assert llm.duration_ms == 880.5
        assert {e.tenant_id for e in events} == {'租户 "q"'}
        assert {(e.version_id, e.route, e.rollout, e.fallback_level) for e in events} == {("v1", "main", "canary", 1)}
        assert len({e.event_id for e in events}) == 4
        assert all(key == b"r-1" for key, _ in emitter.buffered())
        await emitter.stop()

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_event_json_is_the_contract() -> None:
    raw = event_json('r"1', "t", "retrieval", 1_761_300_000_000.5, 12.0, route="fast", attrs={"trace_id": "x"})
    assert orjson.loads(raw) == {
        "request_id": 'r"1',
        "tenant_id": "t",
        "stage": "retrieval",
        "ts_ms": 1_761_300_000_000.5,
        "duration_ms": 12.0,
        "route": "fast",
        "attrs": {"trace_id": "x"},
    }
    event = decode_stage_event(raw, b'r"1', "ttft.stage-events", 0, 0, None, CapsConfig(), 9e12)
    assert isinstance(event, StageEvent)
    instant = orjson.loads(event_json("r", "t", "first_token", 1_761_300_000_000))
    assert "duration_ms" not in instant and "version_id" not in instant


def test_streams_emit_is_the_ttft_emit_distribution() -> None:
    assert StageEmitter is ttft_emit.StageEmitter and event_json is ttft_emit.event_json
    assert streams.emit.ThreadedStageEmitter is ttft_emit.ThreadedStageEmitter


def test_the_threaded_emitter_buffers_events_the_contract_accepts() -> None:
    emitter = ThreadedStageEmitter("127.0.0.1:1", tenant_id="acme", version_id="v1", route="main")
    emitter._buffer.open()  # accept without starting the sender: the buffer is what is checked
    req = emitter.request("r-9", rollout="canary")
    req.request_start()
    with req.stage("prompt_assemble", attrs={"prompt_tokens": 12, "cached_tokens": 8}):
        pass
    req.first_token()
    events = []
    for key, value in emitter.buffered():
        event = decode_stage_event(value, key, "ttft.stage-events", 0, 0, None, CapsConfig(), 9e12)
        assert isinstance(event, StageEvent), event
        events.append(event)
    assert [e.stage for e in events] == ["request_start", "prompt_assemble", "first_token"]
    assert {(e.tenant_id, e.version_id, e.route, e.rollout) for e in events} == {("acme", "v1", "main", "canary")}
