"""The tenant with the Collector alone (docs/otlp-mapping.md): the real Collector with deploy/otel/tenant.yaml
merged over its default config sets ``tenant.id`` on spans that carry no ``ttft.*`` attribute and no tenant,
from the export's ``X-Tenant-Id`` header, else from ``service.name``; a tenant the service set stays. The
spans are the ones OpenInference 0.1.66 exported (tests/data/otel_instrumentations), sent over OTLP/HTTP, and
``ttft otel check`` on the span topic maps every trace to a complete request of that tenant."""

from __future__ import annotations

import asyncio
import json
import struct
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from streams.otel.collector import TENANT_OVERLAY
from tests.fixtures.otel import OtelCollectorHandle
from tests.support.pipeline import read_topic_partitions

pytestmark = [pytest.mark.otel, pytest.mark.kafka, pytest.mark.timeout(180)]

DATA = Path(__file__).resolve().parents[1] / "data" / "otel_instrumentations"


def _requests() -> list[ExportTraceServiceRequest]:
    """The three captured OpenInference traces, without the tenant their capture put on the resource."""
    raw = (DATA / "openinference.otlp").read_bytes()
    out, at = [], 0
    while at < len(raw):
        (size,) = struct.unpack_from(">I", raw, at)
        request = ExportTraceServiceRequest.FromString(raw[at + 4 : at + 4 + size])
        at += 4 + size
        for rs in request.resource_spans:
            kept = [kv for kv in rs.resource.attributes if kv.key != "tenant.id"]
            del rs.resource.attributes[:]
            rs.resource.attributes.extend(kept)
        out.append(request)
    return out


def _set_resource(request: ExportTraceServiceRequest, key: str, value: str) -> None:
    for rs in request.resource_spans:
        kept = [kv for kv in rs.resource.attributes if kv.key != key]
        del rs.resource.attributes[:]
        rs.resource.attributes.extend([*kept, KeyValue(key=key)])
        rs.resource.attributes[-1].value.string_value = value


def _attribute_names(request: ExportTraceServiceRequest) -> set[str]:
    names = set()
    for rs in request.resource_spans:
        names |= {kv.key for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                names |= {kv.key for kv in span.attributes}
    return names


def _post(handle: OtelCollectorHandle, request: ExportTraceServiceRequest, headers: dict[str, str]) -> None:
    req = urllib.request.Request(
        f"{handle.collector.http_endpoint}/v1/traces",
        data=request.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf", **headers},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as response:
        assert response.status == 200


def _tenants_on_topic(handle: OtelCollectorHandle, want: int, timeout_s: float = 60.0) -> dict[str, set[str]]:
    """trace id -> the tenant.id values its spans' resources carry, once ``want`` traces are on the topic."""
    deadline = time.monotonic() + timeout_s
    while True:
        found: dict[str, set[str]] = {}
        for _, _, value in asyncio.run(read_topic_partitions(handle.bootstrap, handle.topic)):
            for rs in ExportTraceServiceRequest.FromString(value).resource_spans:
                tenants = {kv.value.string_value for kv in rs.resource.attributes if kv.key == "tenant.id"}
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        found.setdefault(span.trace_id.hex(), set()).update(tenants or {""})
        if len(found) >= want or time.monotonic() > deadline:
            return found
        time.sleep(1.0)


def test_the_collector_alone_sets_the_tenant_from_a_header_or_the_service_name(
    start_otel_collector: Callable[..., OtelCollectorHandle], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    handle = start_otel_collector(overlays=(TENANT_OVERLAY,))
    by_header, by_service, own = _requests()
    _set_resource(by_service, "service.name", "billing-rag")
    _set_resource(own, "tenant.id", "globex")
    for request in (by_header, by_service):
        names = _attribute_names(request)
        assert "tenant.id" not in names and not any(n.startswith("ttft.") for n in names)
    _post(handle, by_header, {"X-Tenant-Id": "acme"})
    _post(handle, by_service, {})
    _post(handle, own, {"X-Tenant-Id": "acme"})

    def trace_of(request: ExportTraceServiceRequest) -> str:
        return request.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()

    tenants = _tenants_on_topic(handle, 3)
    assert tenants == {trace_of(by_header): {"acme"}, trace_of(by_service): {"billing-rag"}, trace_of(own): {"globex"}}

    from streams.cli.main import main

    monkeypatch.setenv("TTFT_KAFKA_BOOTSTRAP", handle.bootstrap)
    monkeypatch.setenv("TTFT_OTLP__TOPIC", handle.topic)
    monkeypatch.setenv("TTFT_HOME", str(tmp_path))
    result = CliRunner().invoke(main, ["otel", "check", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["traces"], doc["complete"]) == (3, 3)
    (scope,) = doc["scopes"]
    assert scope["tenant"] == {"tenant.id": 3} and scope["missing"] == []
