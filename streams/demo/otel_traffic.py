"""``ttft demo --otel``: one tenant's share of the story played by a service traced by a real instrumentation.

A separate process (the demo starts it like its workers): it rebuilds the demo's plan from the same
arguments (:func:`streams.demo.plan.plan_demo` is deterministic), keeps the requests of ``--tenant`` and hands
each, when the wall clock reaches its end on the demo's pace, to the RAG service of
:mod:`streams.demo.instrumented_service`: the real ``openai`` client instrumented by OpenInference, in the
instrumentation venv (``--python``), one process per version the story deploys (the stable one, then the
canary). Each request is one JSON line on the service's stdin (:func:`request_spec`: the story's stage times
in epoch ms, the model it routes to, its token counts); the service exports its traces over OTLP/HTTP to the
Collector, which writes them to Kafka (``otlp_spans``) for the join's OTLP input (docs/otlp-mapping.md).
No ``ttft.*`` attribute is set anywhere: the tenant is the resource attribute ``tenant.id``.

Usage (by the demo): ``python -m streams.demo.otel_traffic --python <venv python> --endpoint
http://127.0.0.1:4318 --duration 180 --now-ms <plan time> --seed 7 --tenant otel-demo --origin <epoch s>``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from streams.demo.plan import DEMO_TENANTS, OTEL_TENANT, plan_demo

SERVICE = Path(__file__).resolve().with_name("instrumented_service.py")
#: How long an LLM stream runs after its first chunk (the span's end; no stage reads it).
STREAM_TAIL_MS = 300.0


def otel_requests(
    duration_s: float, now_ms: float, seed: int, tenant: str, tenants: tuple[str, ...]
) -> Iterator[tuple[float, list[dict[str, Any]]]]:
    """``(completed_at_ms, events)`` of each of ``tenant``'s requests in the plan, in completion order.

    A request is complete with its ``first_token`` (the simulator emits it last).
    """
    plan = plan_demo(duration_s, now_ms, seed=seed, tenants=tenants)
    needle = f'"tenant_id":{json.dumps(tenant, ensure_ascii=False)}'.encode()
    pending: dict[bytes, list[dict[str, Any]]] = {}
    for key, value, emit_ts in plan.messages():
        if needle not in value:
            continue
        event = orjson.loads(value)
        if event.get("tenant_id") != tenant:
            continue
        pending.setdefault(key, []).append(event)
        if event["stage"] == "first_token":
            yield emit_ts, pending.pop(key)


def request_spec(events: list[dict[str, Any]]) -> dict[str, Any]:
    """One request's stage events as what the instrumented service plays (times in epoch ms).

    ``retrieval`` / ``vector`` / ``rerank`` / ``prompt``: ``[start, duration]`` or absent; ``llm``: one
    ``[start, duration]`` per attempt (the last one answers); ``start`` / ``end``: the root span's; ``model``:
    the route; ``version``: the deployment that serves it. BM25 recall has no convention: it is left out.
    """
    spans: dict[str, list[float]] = {}
    llm: list[list[float]] = []
    start = end = None
    attrs: dict[str, Any] = {}
    names = {"retrieval": "retrieval", "vector_recall": "vector", "rerank": "rerank", "prompt_assemble": "prompt"}
    for event in events:
        stage, ts = event["stage"], float(event["ts_ms"])
        duration = float(event.get("duration_ms") or 0.0)
        if stage == "request_start":
            start = ts
        elif stage == "llm_ttft":
            llm.append([ts, duration])
            attrs.update(event.get("attrs") or {})
        elif stage in names:
            spans[names[stage]] = [ts, duration]
        end = max(end or ts, ts + duration)
    first = events[0]
    if start is None or not llm or end is None:
        raise ValueError(f"request {first['request_id']} has no request_start or no llm_ttft")
    llm.sort()
    return {
        **spans,
        "start": start,
        "end": max(end, llm[-1][0] + llm[-1][1] + STREAM_TAIL_MS) + 1.0,
        "llm": llm,
        "tail": STREAM_TAIL_MS,
        "model": str(first.get("route") or "main"),
        "version": str(first.get("version_id") or "unknown"),
        "prompt_tokens": int(attrs.get("prompt_tokens") or 0),
        "cached_tokens": int(attrs.get("cached_tokens") or 0),
    }


def _start_service(python: str, endpoint: str, tenant: str, version: str) -> subprocess.Popen[str]:
    cmd = [python, str(SERVICE), "--endpoint", endpoint, "--tenant", tenant, "--version", version]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _send(stdin: IO[str] | None, spec: dict[str, Any]) -> None:
    assert stdin is not None
    stdin.write(json.dumps(spec) + "\n")
    stdin.flush()


def _finish(services: dict[str, subprocess.Popen[str]]) -> list[dict[str, Any]]:
    """Close each service's stdin (it flushes its spans and prints what it sent); their summaries."""
    summaries = []
    for version, proc in services.items():
        output, _ = proc.communicate(timeout=180)
        lines = output.strip().splitlines()
        if proc.returncode != 0 or not lines:
            print(f"otel_traffic: the {version} service exited with {proc.returncode}", file=sys.stderr)
            continue
        summaries.append(json.loads(lines[-1]))
    return summaries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", required=True, help="the instrumentation venv's python")
    parser.add_argument("--endpoint", required=True, help="OTLP/HTTP base URL of the Collector")
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--now-ms", type=float, required=True, help="the plan's now_ms")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--tenant", default=OTEL_TENANT)
    parser.add_argument("--tenants", default=",".join(DEMO_TENANTS), help="the plan's tenants, comma-separated")
    parser.add_argument("--origin", type=float, required=True, help="epoch s at which the story starts playing")
    args = parser.parse_args(argv)

    tenants = tuple(args.tenants.split(","))
    plan = plan_demo(args.duration, args.now_ms, seed=args.seed, tenants=tenants)
    services: dict[str, subprocess.Popen[str]] = {}
    sent = 0
    try:
        for done_ms, events in otel_requests(args.duration, args.now_ms, args.seed, args.tenant, tenants):
            spec = request_spec(events)
            version = spec.pop("version")
            if version not in services:
                services[version] = _start_service(args.python, args.endpoint, args.tenant, version)
            delay = args.origin + (done_ms - plan.start_ms) / 1000.0 / plan.speedup - time.time()
            if delay > 0:
                time.sleep(delay)
            _send(services[version].stdin, spec)
            sent += 1
    finally:
        summaries = _finish(services)
    if len(summaries) < len(services):
        return 1
    traces, spans = sum(s["traces"] for s in summaries), sum(s["spans"] for s in summaries)
    ttft = sum(s["ttft_attributes"] for s in summaries)
    library = summaries[0]["library"] if summaries else "-"
    print(
        f"otel_traffic: {traces} traces, {spans} spans sent to {args.endpoint} by {len(services)} service "
        f"process(es) ({', '.join(services)}) traced by {library}; ttft.* attributes on them: {ttft}",
        flush=True,
    )
    return 0 if traces == sent else 1


if __name__ == "__main__":
    sys.exit(main())
