"""Issue 27's hostile traffic, beside issue 14's (tests/integration/test_tenant_isolation.py): what each
attack sends, as messages placed on a topic and a send time, so one paced producer can play a backlog and
then a live tail into several runs at once.

- ``otlp_attacks``: OTLP exports of tenant ``eve`` with NaN, Infinity and near-2^64 values and times, and a
  trace whose root never comes, holding hundreds of stage spans with 4 KB of attributes each;
- ``sprayed_tenants``: one open request each for 20,000 made-up tenant ids;
- ``unparseable``: bytes that are no JSON, all on partition 0 with one producer's header;
- ``laggard``: a tenant whose complete requests arrive 14 minutes after their event time.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from tests.support.otlp_traffic import SpanSpec, build_trace, request_message

#: A producer's batch of OTLP spans, sprayed tenants and garbage carry this producer header.
PRODUCER_HEADER = "ttft-producer"
GARBAGE_MARK = b"fuzz-garbage"
OTLP_TENANT = "eve"
LAGGARD = "laggard"
SPRAY_PREFIX = "spray-"
LAG_MS = 14 * 60_000.0
NEAR_2_64_US = (2**64 - 1) // 1000


@dataclass(frozen=True, slots=True)
class Placed:
    """One message: when to send it (ms since the epoch), to which topic role, partition and headers."""

    send_at_ms: float
    role: str  # "stage-events" or "otlp"
    key: bytes | None
    value: bytes
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def _hostile_spans(spec: Any, rng: random.Random) -> list[SpanSpec]:
    root = next(s for s in spec.spans if s.parent == b"")
    llm = next(s for s in spec.spans if s.name == "llm")
    out = []
    for value in (float("nan"), float("inf"), float("-inf")):
        span = SpanSpec(rng.randbytes(8), root.span_id, "rerank-x", llm.start_us, llm.end_us)
        span.attributes.update({"ttft.stage": "rerank", "ttft.fallback_level": value})
        out.append(span)
    far = SpanSpec(rng.randbytes(8), root.span_id, "retrieve-far", NEAR_2_64_US - 10, NEAR_2_64_US)
    far.attributes["ttft.stage"] = "retrieval"
    llm.attributes["gen_ai.response.time_to_first_chunk"] = float("nan")
    return [*out, far]


def otlp_attacks(window_starts: Sequence[float], held_spans: int = 300) -> list[Placed]:
    """Per window: three traces of ``eve`` with NaN/Infinity attributes and a span near 2^64 ns, and (in
    the first window) one trace whose root never comes with ``held_spans`` stage spans of 4 KB attributes."""
    rng = random.Random(27)
    out: list[Placed] = []
    for w, start_ms in enumerate(window_starts):
        for i in range(3):
            spec = build_trace(
                rng, w * 10 + i, int((start_ms + 5_000 + i * 7_000) * 1000), shape="gen_ai", tenant=OTLP_TENANT
            )
            if spec.llm is None:
                continue
            spans = [*spec.spans, *_hostile_spans(spec, rng)]
            value = request_message(spec, spans).SerializeToString()
            out.append(Placed(spec.end_us / 1000, "otlp", spec.trace_id, value))
        if w == 0:
            spec = build_trace(rng, 999, int((start_ms + 2_000) * 1000), shape="gen_ai", tenant=OTLP_TENANT)
            root = next(s for s in spec.spans if s.parent == b"")
            spec.tenant_on_resource = True
            blob = "x" * (4_096 - 16)
            held = [
                SpanSpec(
                    rng.randbytes(8),
                    root.span_id,
                    f"extra-{k}",
                    root.start_us + k,
                    root.start_us + k + 50,
                    {"ttft.stage": "rerank", "ttft.blob": blob},
                )
                for k in range(held_spans)
            ]
            for part in range(0, held_spans, 50):  # exports of 50 spans, never the root
                value = request_message(spec, held[part : part + 50]).SerializeToString()
                out.append(Placed(start_ms + 3_000 + part, "otlp", spec.trace_id, value))
    return out


def sprayed_tenants(window_starts: Sequence[float], total: int = 20_000) -> list[Placed]:
    """``total`` made-up tenant ids, one ``request_start`` each, spread over the windows."""
    per = -(-total // len(window_starts))
    out: list[Placed] = []
    n = 0
    for start_ms in window_starts:
        for k in range(min(per, total - n)):
            ts = start_ms + 200 + k * (55_000 / per)
            rid = f"spray-r{n}"
            event = {
                "request_id": rid,
                "tenant_id": f"{SPRAY_PREFIX}{n}",
                "version_id": "s1",
                "stage": "request_start",
                "ts_ms": ts,
            }
            out.append(
                Placed(ts, "stage-events", rid.encode(), orjson.dumps(event), headers=((PRODUCER_HEADER, b"sprayer"),))
            )
            n += 1
    return out


def unparseable(window_start: float, count: int = 2_000) -> list[Placed]:
    """``count`` messages that do not parse, on partition 0, from producer ``fuzzer``, over 20 s."""
    return [
        Placed(
            window_start + 1_000 + k * (20_000 / count),
            "stage-events",
            None,
            GARBAGE_MARK + b"-%d\xff{not json" % k,
            partition=0,
            headers=((PRODUCER_HEADER, b"fuzzer"),),
        )
        for k in range(count)
    ]


def laggard(start_ms: float, end_ms: float, every_ms: float = 2_000.0) -> list[Placed]:
    """A complete request every ``every_ms`` from ``start_ms`` to ``end_ms`` (send times), each with event
    times ``LAG_MS`` older than when it is sent."""
    out: list[Placed] = []
    t, n = start_ms, 0
    while t < end_ms:
        rid = f"lag-{n}"
        base = {"request_id": rid, "tenant_id": LAGGARD, "version_id": "l1"}
        ts = t - LAG_MS
        events = [
            {**base, "stage": "request_start", "ts_ms": ts - 400.0},
            {**base, "stage": "retrieval", "ts_ms": ts - 390.0, "duration_ms": 100.0},
            {**base, "stage": "prompt_assemble", "ts_ms": ts - 280.0, "duration_ms": 30.0},
            {**base, "stage": "llm_ttft", "ts_ms": ts - 240.0, "duration_ms": 230.0},
            {**base, "stage": "first_token", "ts_ms": ts - 5.0},
        ]
        out += [Placed(t, "stage-events", rid.encode(), orjson.dumps(e)) for e in events]
        t += every_ms
        n += 1
    return out


def placed(messages: Iterable[tuple[bytes, bytes]], latest_ms: float | None = None) -> list[Placed]:
    """Stage-event messages sent at their own event time, or at ``latest_ms`` if that is earlier (events
    claiming a time ahead of the clock are sent with their window)."""
    out = []
    for k, v in messages:
        ts = orjson.loads(v)["ts_ms"]
        out.append(Placed(ts if latest_ms is None else min(ts, latest_ms), "stage-events", k, v))
    return out


@dataclass
class PacedProducer:
    """Plays each run's messages into its topics: everything due at start at once (a backlog), the rest
    when the clock reaches each message's send time (a live tail). A thread; ``join`` waits for the end."""

    bootstrap: str
    #: run name -> (topic of each role, messages)
    runs: dict[str, tuple[dict[str, str], list[Placed]]]
    sent: dict[str, int] = field(default_factory=dict)
    backlog: dict[str, int] = field(default_factory=dict)
    error: list[BaseException] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def send_backlog(self) -> None:
        """Send what is due now (blocking), before the workers start."""
        asyncio.run(self._play(until_ms=time.time() * 1000.0, backlog=True))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="paced-producer", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        assert self._thread is not None
        self._thread.join(timeout)
        if self.error:
            raise self.error[0]
        assert not self._thread.is_alive(), "the paced producer did not finish"

    def _run(self) -> None:
        try:
            asyncio.run(self._play(until_ms=None, backlog=False))
        except BaseException as exc:  # reported by join()
            self.error.append(exc)

    async def _play(self, until_ms: float | None, backlog: bool) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            linger_ms=5,
            max_batch_size=1024 * 1024,
            max_request_size=4 * 1024 * 1024,
            acks="all",
        )
        await producer.start()
        try:
            queues = {name: sorted(msgs, key=lambda m: m.send_at_ms) for name, (_, msgs) in self.runs.items()}
            cursor = {name: self.sent.get(name, 0) for name in self.runs}
            while True:
                now = time.time() * 1000.0 if until_ms is None else until_ms
                pending = []
                for name, queue in queues.items():
                    topics = self.runs[name][0]
                    i = cursor[name]
                    while i < len(queue) and queue[i].send_at_ms <= now:
                        m = queue[i]
                        pending.append(
                            await producer.send(
                                topics[m.role], m.value, key=m.key, partition=m.partition, headers=list(m.headers)
                            )
                        )
                        i += 1
                        if len(pending) >= 5_000:
                            await asyncio.gather(*pending)
                            pending = []
                    cursor[name] = i
                await asyncio.gather(*pending)
                self.sent = dict(cursor)
                if backlog:
                    self.backlog = dict(cursor)
                    return
                if all(cursor[n] >= len(q) for n, q in queues.items()):
                    return
                await asyncio.sleep(0.1)
        finally:
            await producer.stop()
