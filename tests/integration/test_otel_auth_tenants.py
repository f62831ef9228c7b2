"""Issue 27 item 7, the OpenTelemetry half: the tenant comes from the Collector's authenticated client.

The real Collector with deploy/otel/auth.yaml merged over its default config (per-tenant bearer tokens:
JWTs signed by the operator's key, verified by the ``oidc`` authenticator against a local JWKS file), the
session broker and ``ttft worker --role join`` (the OTLP bridge) with ``otlp.tenant_source: resource``:

- acme's token over OTLP/HTTP and globex's over OTLP/gRPC: their traces become requests of acme and globex;
- acme's token on traces that claim ``globex`` (on the resource, as ``ttft.tenant_id`` on the root span, and
  as ``tenant.id`` on every span): the requests are acme's;
- no token, a token signed by another key, an expired token (HTTP) and no or a wrong token (gRPC): refused
  by the Collector (HTTP 401, gRPC ``UNAUTHENTICATED``); none of their spans reaches the span topic, and no
  request of theirs is made.
"""

from __future__ import annotations

import asyncio
import random
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from streams.kafka.topics import ensure_topics
from streams.otel.collector import AUTH_OVERLAY
from streams.otel.tokens import make_keys, mint
from streams.ports import free_port
from streams.settings import Settings
from tests.fixtures.otel import OtelCollectorHandle
from tests.support.otlp_traffic import TraceSpec, build_trace, request_message
from tests.support.pipeline import Pipeline, pipeline_env, read_topic_partitions

pytestmark = [pytest.mark.otel, pytest.mark.kafka, pytest.mark.e2e, pytest.mark.timeout(180)]


def _trace(rng: random.Random, i: int, tenant: str) -> TraceSpec:
    """A trace with an LLM span (so it resolves at its first chunk, not at the request timeout)."""
    start = int(time.time() * 1e6) - 120_000_000 + i * 1_000_000
    while True:
        spec = build_trace(rng, i, start, shape=("openinference", "gen_ai")[i % 2], tenant=tenant)
        if spec.llm is not None:
            return spec


def _message(spec: TraceSpec, span_tenant: str | None = None) -> ExportTraceServiceRequest:
    msg = request_message(spec, spec.spans)
    if span_tenant is not None:
        for span in msg.resource_spans[0].scope_spans[0].spans:
            span.attributes.append(KeyValue(key="tenant.id"))
            span.attributes[-1].value.string_value = span_tenant
    return msg


def _post(handle: OtelCollectorHandle, msg: ExportTraceServiceRequest, token: str | None) -> int:
    headers = {"Content-Type": "application/x-protobuf"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(
        f"{handle.collector.http_endpoint}/v1/traces", data=msg.SerializeToString(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _export_grpc(handle: OtelCollectorHandle, msg: ExportTraceServiceRequest, token: str | None) -> grpc.StatusCode:
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(handle.collector.grpc_endpoint) as channel:
        try:
            TraceServiceStub(channel).Export(msg, metadata=metadata, timeout=10)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _span_topic_traces(handle: OtelCollectorHandle) -> dict[str, set[str]]:
    """trace id -> the tenant.id values on the resources of its spans on the span topic."""
    found: dict[str, set[str]] = {}
    for _, _, value in asyncio.run(read_topic_partitions(handle.bootstrap, handle.topic)):
        for rs in ExportTraceServiceRequest.FromString(value).resource_spans:
            tenants = {kv.value.string_value for kv in rs.resource.attributes if kv.key == "tenant.id"}
            for ss in rs.scope_spans:
                for span in ss.spans:
                    found.setdefault(span.trace_id.hex(), set()).update(tenants)
    return found


def _requests(settings: Settings) -> dict[str, dict[str, Any]]:
    """request id -> the join's last record of it on the requests topic."""
    out: dict[str, dict[str, Any]] = {}
    for _, _, value in asyncio.run(read_topic_partitions(settings.kafka_bootstrap, settings.topic("requests"))):
        record = orjson.loads(value)
        if "request_id" in record:  # not a watermark message
            out[record["request_id"]] = record
    return out


def test_the_tenant_is_the_authenticated_clients_and_unauthenticated_clients_are_refused(
    start_otel_collector: Any, kafka_settings: Settings, tmp_path: Path
) -> None:
    keys = make_keys(tmp_path / "auth")
    other = make_keys(tmp_path / "other")
    acme, globex = mint(keys.key, "acme"), mint(keys.key, "globex")
    forged = mint(other.key, "acme")
    expired = mint(keys.key, "acme", days=1, now_s=time.time() - 3 * 86_400)
    handle = start_otel_collector(overlays=(AUTH_OVERLAY,), env={"TTFT_OTEL__AUTH_KEYS": str(keys.jwks)})

    asyncio.run(ensure_topics(kafka_settings))
    env = pipeline_env(
        kafka_settings,
        tmp_path / "home",
        TTFT_OTLP__TOPIC=handle.topic,
        TTFT_OTLP__TENANT_SOURCE="resource",
        TTFT_JOIN__CONSUMER="batch",
        TTFT_JOIN__REQUEST_TIMEOUT_MS="8000",
    )
    (tmp_path / "home").mkdir()
    pipe = Pipeline(env, tmp_path / "home")
    try:
        join = pipe.start("join", free_port())
        pipe.wait_healthy(join)

        rng = random.Random(27)
        refused = [_trace(rng, i, "mallory") for i in range(1, 6)]
        t0 = time.monotonic()
        http_codes = [
            _post(handle, _message(refused[0]), None),
            _post(handle, _message(refused[1]), forged),
            _post(handle, _message(refused[2]), expired),
        ]
        grpc_codes = [
            _export_grpc(handle, _message(refused[3]), None),
            _export_grpc(handle, _message(refused[4]), forged),
        ]
        assert http_codes == [401, 401, 401]
        assert grpc_codes == [grpc.StatusCode.UNAUTHENTICATED] * 2

        own_acme, own_globex = _trace(rng, 10, "acme"), _trace(rng, 11, "globex")
        # acme's token on traces claiming globex: i even puts tenant.id on the resource, i odd ttft.tenant_id
        # on the root span; the second also carries tenant.id=globex on every span.
        claim_resource, claim_spans = _trace(rng, 12, "globex"), _trace(rng, 13, "globex")
        assert claim_resource.tenant_on_resource and not claim_spans.tenant_on_resource
        assert _post(handle, _message(own_acme), acme) == 200
        assert _export_grpc(handle, _message(own_globex), globex) == grpc.StatusCode.OK
        assert _post(handle, _message(claim_resource), acme) == 200
        assert _export_grpc(handle, _message(claim_spans, span_tenant="globex"), acme) == grpc.StatusCode.OK
        sent_s = time.monotonic() - t0

        accepted = [(own_acme, "acme"), (own_globex, "globex"), (claim_resource, "acme"), (claim_spans, "acme")]
        want = {spec.rid: tenant for spec, tenant in accepted}
        pipe.wait_for(lambda: set(want) <= set(_requests(kafka_settings)), 90, "the four accepted requests")
        landed_s = time.monotonic() - t0
        records = _requests(kafka_settings)
        assert {rid: records[rid]["tenant_id"] for rid in want} == want
        assert all(records[rid]["status"] == "complete" for rid in want), {r: records[r]["status"] for r in want}
        assert not {spec.rid for spec in refused} & set(records)
        assert {r["tenant_id"] for r in records.values()} <= {"acme", "globex"}

        on_topic = _span_topic_traces(handle)
        assert set(on_topic) == {spec.trace_id.hex() for spec, _ in accepted}
        # On the topic already, every span's resource names the authenticated tenant alone.
        assert {spec.rid: on_topic[spec.trace_id.hex()] for spec, _ in accepted} == {r: {t} for r, t in want.items()}
        # Every span of the trace claiming globex on its spans had its claims dropped, and counted.
        assert join.metric("ttft_otlp_tenant_claims_ignored_total") == len(claim_spans.spans)
        # The tokens stop at the receiver: none is in what the Collector wrote to Kafka.
        values = [v for _, _, v in asyncio.run(read_topic_partitions(handle.bootstrap, handle.topic))]
        assert not any(t.encode() in v for v in values for t in (acme, globex, forged, expired))
        assert join.alive()
        print(f"auth tenants: 5 clients refused, 4 requests landed {landed_s:.1f} s after the first export")
        print(f"auth tenants: the nine exports took {sent_s:.2f} s")
    finally:
        pipe.stop_all()
