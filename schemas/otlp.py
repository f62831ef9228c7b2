"""One Kafka message of the Collector's ``kafkaexporter`` (an OTLP ``ExportTraceServiceRequest``) -> spans.

Two encodings (docs/design.md, "OpenTelemetry spans"): ``otlp_proto``, the protobuf bytes, and ``otlp_json``,
the OTLP/JSON mapping. OTLP/JSON is not protobuf's canonical JSON in one respect: ``traceId``, ``spanId``
and ``parentSpanId`` are lowercase hex strings, not base64. They are rewritten to base64 before the
generated message parses the rest, which also accepts int64 values as strings or numbers, enums as
integers or names, and field names in lowerCamelCase or snake_case, as the OTLP spec requires.

:func:`decode_otlp_message` never raises: a payload that does not parse, or a span without a valid
trace or span id, dead-letters the whole message (``otlp_decode``). Only scalar attribute values are kept
(maps and bytes never feed a stage event), and the string arrays of :data:`STRING_ARRAY_KEYS`, as JSON text.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from schemas.dead_letter import DeadLetter, make_dead_letter
from streams.settings import CapsConfig

OtlpEncoding = Literal["otlp_proto", "otlp_json"]
#: Where a span's tenant may come from (the setting ``otlp.tenant_source``): ``attributes``, any tenant
#: attribute on the span or its resource (the span's own first); ``resource``, the resource's ``tenant.id``
#: alone, which the Collector's authenticated-tenant recipe (deploy/otel/auth.yaml) writes from the
#: client's credential: tenant claims on the span, and ``ttft.tenant_id`` anywhere, are dropped.
TenantSource = Literal["attributes", "resource"]
AttrValue = str | bool | int | float
Attributes = dict[str, AttrValue]

_TRACE_ID_BYTES: Final = 16
_SPAN_ID_BYTES: Final = 8
_JSON_ERRORS: Final = (
    orjson.JSONDecodeError,
    json_format.ParseError,
    RecursionError,
    TypeError,
    ValueError,
    AttributeError,
)
#: The attributes that name a tenant (streams/core/otlp_mapping.py, ``CONTEXT_ATTRS["tenant_id"]``).
_TENANT_CLAIMS: Final = ("ttft.tenant_id", "tenant.id")
_HEX_ID_KEYS: Final = frozenset({"traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"})


@dataclass(frozen=True, slots=True)
class OtlpSpanEvent:
    """A span event (e.g. ``gen_ai.first_chunk`` or ``First Token Stream Event``)."""

    name: str
    time_ns: int
    attributes: Attributes


@dataclass(frozen=True, slots=True)
class OtlpSpan:
    """One span, flattened: ``attributes`` holds the span's own attributes over its resource's."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: Attributes
    events: tuple[OtlpSpanEvent, ...] = ()
    #: The instrumentation scope that made the span (e.g. ``openinference.instrumentation.openai``).
    scope_name: str = ""
    scope_version: str = ""
    #: With ``tenant_source: resource``: the span, or its resource as ``ttft.tenant_id``, named a tenant other
    #: than its resource's ``tenant.id`` (the authenticated one), and that claim was dropped.
    ignored_tenant_claim: bool = False

    @property
    def is_root(self) -> bool:
        """No parent span: the trace's root (its start is the request's start)."""
        return not self.parent_span_id


class OtlpDecodeError(ValueError):
    """The payload is not an ExportTraceServiceRequest of the configured encoding."""


def decode_otlp_message(
    raw_value: bytes | None,
    encoding: OtlpEncoding,
    *,
    topic: str,
    partition: int,
    offset: int,
    kafka_timestamp_ms: int | None,
    caps: CapsConfig,
    received_at_ms: float,
    tenant_source: TenantSource = "attributes",
) -> list[OtlpSpan] | DeadLetter:
    """The spans of one ``otlp_spans`` message, or a dead letter (``otlp_decode``) saying why not."""
    raw = b"" if raw_value is None else bytes(raw_value)
    try:
        return parse_spans(raw, encoding, tenant_source)
    except OtlpDecodeError as exc:
        return make_dead_letter(
            "otlp_decode",
            f"{encoding}: {exc}",
            raw,
            topic=topic,
            partition=partition,
            offset=offset,
            kafka_timestamp_ms=kafka_timestamp_ms,
            max_original_bytes=caps.dead_letter_bytes,
            received_at_ms=received_at_ms,
        )


def parse_spans(raw: bytes, encoding: OtlpEncoding, tenant_source: TenantSource = "attributes") -> list[OtlpSpan]:
    """Parse ``raw`` into spans (their tenant attributes as ``tenant_source`` says); raises
    :class:`OtlpDecodeError`."""
    request = ExportTraceServiceRequest()
    if encoding == "otlp_proto":
        try:
            request.ParseFromString(raw)
        except (DecodeError, RecursionError, ValueError) as exc:
            raise OtlpDecodeError(f"not an ExportTraceServiceRequest: {exc}") from None
    else:
        try:
            document = _hex_ids_to_base64(orjson.loads(raw))
            json_format.ParseDict(document, request, ignore_unknown_fields=True)
        except (
            orjson.JSONDecodeError,
            json_format.ParseError,
            RecursionError,
            TypeError,
            ValueError,
            AttributeError,
        ) as exc:
            raise OtlpDecodeError(f"not OTLP/JSON: {str(exc)[:200]}") from None
    return _flatten(request, tenant_source == "resource")


def _flatten(request: ExportTraceServiceRequest, tenant_from_resource: bool = False) -> list[OtlpSpan]:
    spans: list[OtlpSpan] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        resource_tenant = resource.get("tenant.id")
        resource_claim = resource.pop("ttft.tenant_id", None) if tenant_from_resource else None
        for scope_spans in resource_spans.scope_spans:
            scope_name, scope_version = scope_spans.scope.name, scope_spans.scope.version
            for span in scope_spans.spans:
                where = f"span {len(spans)} ({span.name[:80]!r})"
                trace_id = _hex_id(span.trace_id, _TRACE_ID_BYTES, f"{where}: trace_id")
                span_id = _hex_id(span.span_id, _SPAN_ID_BYTES, f"{where}: span_id")
                parent = _hex_id(span.parent_span_id, _SPAN_ID_BYTES, f"{where}: parent_span_id", optional=True)
                events = tuple(OtlpSpanEvent(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in span.events)
                attributes = {**resource, **_attributes(span.attributes)}
                ignored = False
                if tenant_from_resource:
                    claims = {attributes.pop(name, None) for name in _TENANT_CLAIMS} | {resource_claim}
                    ignored = bool(claims - {None, resource_tenant})
                    if resource_tenant is not None:
                        attributes["tenant.id"] = resource_tenant
                spans.append(
                    OtlpSpan(
                        trace_id=trace_id,
                        span_id=span_id,
                        parent_span_id=parent,
                        name=span.name,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=attributes,
                        events=events,
                        scope_name=scope_name,
                        scope_version=scope_version,
                        ignored_tenant_claim=ignored,
                    )
                )
    return spans


def _hex_id(value: bytes, size: int, what: str, *, optional: bool = False) -> str:
    """Lowercase hex of an id; all zero or empty is invalid (or ``""`` for an optional parent id)."""
    if optional and not any(value):
        return ""
    if len(value) != size or not any(value):
        raise OtlpDecodeError(f"{what} must be {size} bytes, not all zero (got {len(value)} bytes)")
    return value.hex()


#: Array attributes kept, as the JSON text of their string items (some instrumentations write them that way
#: already): the GenAI finish reasons, which tell an agent's tool-call turn (docs/otlp-mapping.md).
STRING_ARRAY_KEYS: Final = frozenset({"gen_ai.response.finish_reasons"})
_MAX_ARRAY_ITEMS: Final = 16


def _attributes(pairs: Any) -> Attributes:
    out: Attributes = {}
    for pair in pairs:
        value = _scalar(pair)
        if value is None and pair.key in STRING_ARRAY_KEYS:
            value = _string_array(pair.value)
        if value is not None:
            out[pair.key] = value
    return out


def _string_array(value: AnyValue) -> str | None:
    """An array of strings as JSON text (its first :data:`_MAX_ARRAY_ITEMS` strings); None for anything else."""
    if value.WhichOneof("value") != "array_value":
        return None
    items = [
        v.string_value for v in value.array_value.values[:_MAX_ARRAY_ITEMS] if v.WhichOneof("value") == "string_value"
    ]
    return orjson.dumps(items).decode()


def _scalar(pair: KeyValue) -> AttrValue | None:
    value: AnyValue = pair.value
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    return None


def _hex_ids_to_base64(node: Any) -> Any:
    """OTLP/JSON's hex trace and span ids, as the base64 protobuf's JSON parser expects (in place)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _HEX_ID_KEYS and isinstance(value, str):
                node[key] = _hex_to_base64(value, key)
            else:
                _hex_ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item)
    return node


def _hex_to_base64(value: str, key: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(value)).decode("ascii")
    except (ValueError, binascii.Error):
        raise OtlpDecodeError(f"{key} must be a hex string, got {value[:40]!r}") from None
