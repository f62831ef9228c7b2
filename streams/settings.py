"""One frozen, validated settings object for every process of the pipeline.

Sources, highest priority first: explicit keyword arguments, environment variables (``TTFT_*``, nested
sections with ``__``, e.g. ``TTFT_JOIN__GRACE_MS=500``), the YAML file named by ``TTFT_CONFIG``, then the
defaults below. Nothing reads the environment at import time: call :func:`load_settings`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from schemas.vocabulary import INSTANT_STAGES as INSTANT_STAGES  # re-exported for existing importers
from schemas.vocabulary import KNOWN_STAGES as KNOWN_STAGES
from schemas.vocabulary import PARENT_STAGES as PARENT_STAGES
from schemas.vocabulary import REQUIRED_STAGES, is_stage_name
from schemas.vocabulary import SUB_STAGES as SUB_STAGES
from streams.rules_config import RulesConfig


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class JoinConfig(_Section):
    """How stage events become request records (docs/design.md, join semantics)."""

    grace_ms: int = Field(2_000, ge=0, description="Wait after first_token for stragglers before emitting.")
    request_timeout_ms: int = Field(30_000, gt=0, description="No first_token this long after start: timed_out.")
    forget_after_ms: int = Field(
        120_000, gt=0, description="Emitted requests are remembered this long (event time) to absorb replays."
    )
    max_open_requests: int = Field(
        200_000, gt=0, description="Cap; the oldest open request of the tenant holding the most is evicted."
    )
    max_remembered_requests: int = Field(
        200_000, gt=0, description="Emitted requests kept to absorb late events; past it the soonest-forgotten go."
    )
    max_open_requests_per_tenant: int = Field(
        50_000, gt=0, description="Per-tenant cap; past it the tenant's own oldest open request is evicted."
    )
    max_events_per_request: int = Field(
        1_000, gt=0, le=65_535, description="Events folded per request; more are dead-lettered too_many_events."
    )
    max_watermark_step_ms: int = Field(
        600_000, gt=0, description="One event moves its partition's watermark at most this far (event time)."
    )
    max_watermark_lead_ms: int = Field(
        10_000, gt=0, description="No event moves a watermark further than this past the worker's clock."
    )
    max_tenant_lag_ms: int = Field(
        900_000,
        ge=0,
        description=(
            "A tenant's watermark trails its partition's leading tenant by at most this much (event time); "
            "within it, another tenant's clock never moves it. Above max_watermark_step_ms, so no single "
            "event of one tenant drags another."
        ),
    )
    max_window_wait_ms: int | None = Field(
        None,
        ge=0,
        description=(
            "How far (event time) a tenant may trail its partition's leading tenant and still hold the watermark "
            "the writer closes windows on; a tenant further behind has its records come as late amendments. "
            "None: windows.grace_s. max_tenant_lag_ms: every tenant holds the windows (the old behaviour)."
        ),
    )
    max_late_reemissions: int = Field(
        10,
        ge=0,
        description="Late events of an emitted request re-emit its record this often; later ones once, at forget.",
    )
    max_request_state_bytes: int = Field(
        65_536,
        ge=4_096,
        le=900_000,
        description="Bound on one request's changelog value; an event past it is dead-lettered too_many_events.",
    )
    idle_tick_ms: int = Field(1_000, gt=0, description="Wall-clock tick that advances an idle partition.")
    required_stages: tuple[str, ...] = REQUIRED_STAGES
    route_required_stages: dict[str, tuple[str, ...]] = Field(
        default_factory=dict, description="Per-route override of the required stages, e.g. {'fast': [...]}."
    )
    batch_max: int = Field(
        10_000, gt=0, description="Events per fetch folded in one step; its records leave when it is folded."
    )
    state_every_ms: int = Field(
        500,
        ge=0,
        description="The join's state (one changelog write per touched request) and its committed offsets are "
        "written at most this often (0: after every fetch); records do not wait for it.",
    )
    batch_within_s: float = Field(0.2, gt=0)
    consumer: Literal["batch"] = Field(
        "batch",
        description="The join's consumer: the partition-batch runner (streams/kafka/batches.py) feeding the join's "
        "Faust agent. The per-message Faust stream adapter ('faust') was removed; the batch runner resumes from "
        "its committed offsets and changelog.",
    )

    @model_validator(mode="after")
    def _check(self) -> JoinConfig:
        if self.grace_ms >= self.request_timeout_ms:
            raise ValueError("join.grace_ms must be smaller than join.request_timeout_ms")
        if self.forget_after_ms < self.grace_ms:
            raise ValueError("join.forget_after_ms must be at least join.grace_ms")
        for name in (*self.required_stages, *(s for v in self.route_required_stages.values() for s in v)):
            if not is_stage_name(name):
                raise ValueError(f"join.required_stages: {name!r} is not a stage name")
        return self


class WindowConfig(_Section):
    """Event-time windows of the aggregates (docs/design.md, windows)."""

    window_s: int = Field(60, gt=0, description="W: window_start = floor(started_at / W) * W.")
    grace_s: int = Field(10, ge=0, description="Allowed lateness after the join's watermark before a window closes.")
    idle_close_s: float | None = Field(
        None, gt=0, description="Idle this long, windows close on the wall clock (default: join timeout + grace)."
    )
    relative_accuracy: float = Field(0.01, gt=0, lt=0.5)
    max_series: int = Field(1_000, gt=0, description="Cap on tenant x version series; overflow -> __other__.")
    max_custom_stages_per_tenant: int = Field(
        30, gt=0, description="Custom stage names per tenant and window; the rest aggregate as stage __other__."
    )
    max_routes_per_tenant: int = Field(
        20, gt=0, description="Routes per tenant and window in stage_strata; the rest aggregate as route __other__."
    )
    max_versions_per_tenant: int = Field(
        50, gt=0, description="Versions per tenant and window; the rest fold into the tenant's own __other__."
    )
    cacheable_min_tokens: int = Field(1_024, ge=0)
    recompute_lookback_s: int = Field(7_200, gt=0, description="Windows re-derived from the store at start.")
    held_records_max: int = Field(
        600_000,
        ge=0,
        description="Records of open windows the writer keeps to close them without reading them back "
        "(about 0.9 KB each); past it, a window's close reads the store. 0: always read the store.",
    )

    @model_validator(mode="after")
    def _check(self) -> WindowConfig:
        if self.grace_s >= self.window_s * 60:
            raise ValueError("windows.grace_s must be below 60 windows")
        return self


class CapsConfig(_Section):
    """Input bounds. Anything beyond them is dead-lettered with a reason code."""

    max_event_bytes: int = Field(8_192, gt=256)
    max_attrs_bytes: int = Field(2_048, gt=0)
    max_attrs_keys: int = Field(32, gt=0)
    max_json_depth: int = Field(8, gt=1)
    dead_letter_bytes: int = Field(4_096, gt=0, description="Original bytes kept per dead letter (truncated).")
    skew_limit_ms: int = Field(
        300_000,
        gt=0,
        description="An event ending this long after the worker's clock (or broker append time) is timestamp_skew.",
    )
    halt_window_messages: int = Field(
        1_000, gt=0, description="Window of messages the dead-letter guard judges the invalid share over."
    )
    halt_dead_letter_share: float = Field(
        0.5, gt=0, le=1.0, description="Quarantine the source of the dead letters above this share of the window."
    )
    max_quarantined_tenants: int = Field(
        10,
        ge=0,
        description="Tenants, and separately producers, the guard may quarantine; past it, it quarantines the "
        "partition with the most dead letters (the guard never halts ingestion).",
    )
    store_halt_page_s: float = Field(
        120.0,
        gt=0,
        description="The writer pages TTFTIngestHalted once the store has refused every call this long (it keeps "
        "retrying, committing nothing) and resolves it at the next call the store accepts.",
    )
    quarantine_release_messages: int = Field(
        0,
        ge=0,
        description="Messages without a dead letter of a quarantined source before it is released and its page "
        "resolves (0: five guard windows).",
    )
    producer_header: str = Field(
        "ttft-producer",
        min_length=1,
        max_length=64,
        description="Kafka header naming the producer of a stage event; the guard quarantines bytes without a "
        "tenant by (source partition, this header), or by partition when a message has none.",
    )


class OtlpConfig(_Section):
    """The OpenTelemetry input: Collector ``kafkaexporter`` messages mapped to stage events (docs/design.md,
    "OpenTelemetry spans"). It runs inside the join's worker, as its own agent on its own consumer group
    (streams/app/otlp_fold.py)."""

    enabled: bool = Field(True, description="Consume the OTLP span topic in the join process.")
    topic: str = Field(
        "otlp_spans",
        pattern=r"^[A-Za-z0-9._-]{1,249}$",
        description="The Collector kafkaexporter's topic; its default name, never prefixed.",
    )
    encoding: Literal["otlp_proto", "otlp_json"] = Field(
        "otlp_proto", description="The exporter's encoding: one ExportTraceServiceRequest per message."
    )
    max_traces: int = Field(
        100_000,
        gt=0,
        description="Traces held or remembered; past it the oldest trace of the tenant holding the most is "
        "resolved early or forgotten (counted).",
    )
    max_traces_per_tenant: int = Field(
        100_000,
        gt=0,
        description="Traces held or remembered per tenant; past it the tenant's own oldest is resolved early or "
        "forgotten (counted). Spans that name no tenant count as one tenant.",
    )
    max_spans_per_trace: int = Field(
        512, gt=0, le=10_000, description="Spans held per trace; more are dead-lettered too_many_events."
    )
    max_trace_state_bytes: int = Field(
        262_144,
        ge=65_536,
        le=900_000,
        description="Bound on one trace's changelog value (below the producer's batch and Kafka's default "
        "message size); a span past it is dead-lettered too_many_events.",
    )
    tenant_source: Literal["attributes", "resource"] = Field(
        "attributes",
        description="Where a span's tenant comes from: 'attributes', any tenant.id or ttft.tenant_id on the span "
        "or its resource (the span's own first); 'resource', the resource's tenant.id alone, which the "
        "authenticated-tenant Collector recipe (deploy/otel/auth.yaml) writes from the client's bearer token: "
        'tenant claims on spans are ignored (docs/otlp-mapping.md, "Authenticated tenants").',
    )


class TenancyConfig(_Section):
    """Registered tenants and the shared pool of all others (docs/operations.md, "Registered tenants").

    On by default: the registered tenants are those listed in ``registered`` plus every tenant configured
    under ``tenants``, plus every tenant with requests in ``steady_windows`` consecutive event-time windows
    (promoted: in the join over the requests it sees, in the writer over the windows it stores, so a writer
    restart or a replay keeps them; a promotion lasts ``keep_promoted_windows`` after the last such run).
    Each registered tenant keeps its own clock, open-request cap, series slots and silence alert. Every other
    tenant shares one pool: one clock per partition, ``max_open_requests_pool`` open requests,
    ``max_remembered_requests_pool`` emitted ones remembered, at most ``max_series_pool`` series per window, no
    silence alert. The pool never evicts a registered tenant's requests (open or remembered) or takes its
    series slots, and the join's cost per event does not grow with the number of
    tenants in it.
    """

    registered: Annotated[tuple[str, ...] | None, NoDecode] = Field(
        None,
        description="Tenants with their own budgets besides those under tenants and the steady ones "
        "(TTFT_TENANCY__REGISTERED=acme,globex); unset: none listed.",
    )
    steady_windows: int = Field(
        3,
        ge=0,
        description="A tenant with requests in this many consecutive windows is registered (promoted) in the join "
        "and the writer (0: only the listed and configured tenants).",
    )
    keep_promoted_windows: int = Field(
        1_440,
        gt=0,
        description="A promotion ends this many windows after the last window that ended a run of steady_windows.",
    )
    max_promoted: int = Field(100, ge=0, description="Cap on tenants promoted at once (per join worker; the writer).")
    max_steady_candidates: int = Field(
        10_000,
        gt=0,
        description="New tenants the join tracks per window for steady_windows; more wait for the next window.",
    )
    max_open_requests_pool: int = Field(
        20_000, gt=0, description="Open requests of all unregistered tenants together; past it the pool's oldest go."
    )
    max_remembered_requests_pool: int = Field(
        200_000,
        ge=0,
        description="Emitted requests of all unregistered tenants together kept to absorb late events; past it the "
        "pool's soonest-forgotten go. The global join.max_remembered_requests takes the pool's first (the default "
        "is that cap's, so only which requests go changes, not how many).",
    )
    max_series_pool: int = Field(
        50, ge=0, description="Series per window of all unregistered tenants together; the rest fold into __other__."
    )

    @field_validator("registered", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str):
            return tuple(t.strip() for t in v.split(",") if t.strip())
        return v

    @field_validator("registered")
    @classmethod
    def _names(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for tenant in v or ():
            if len(tenant) > 64 or tenant == "__other__":
                raise ValueError(f"tenancy.registered: {tenant!r} is not a tenant id")
        return v


class StoreConfig(_Section):
    """The embedded store's read-only ClickHouse HTTP interface (streams/store/http_interface.py).

    The process that holds a chDB store (the writer) serves it on ``http_host:http_port`` so that readers
    (``ttft breakdown``/``report``/``request``/``whatif``, clickhouse-connect, Grafana's plugin over HTTP)
    reach the live store as they would a server. Off for a ClickHouse server URL (the server serves itself).
    """

    http_port: int = Field(8123, ge=0, le=65535, description="Port of the interface; 0 turns it off.")
    http_host: str = Field("127.0.0.1", min_length=1, description="Bind address; 0.0.0.0 to serve other hosts.")
    http_password: SecretStr | None = Field(
        None, description="Password of user 'default' (none by default, as on a fresh ClickHouse server)."
    )
    http_max_execution_s: float = Field(
        10.0, gt=0, le=3_600, description="Cap on one query's time (max_execution_time); it holds the store thread."
    )
    http_max_result_bytes: int = Field(
        128 * 1_048_576, gt=0, description="Cap on one query's result (max_result_bytes, uncompressed)."
    )
    http_max_memory_bytes: int = Field(
        2 * 1_073_741_824, gt=0, description="Cap on one query's memory (max_memory_usage) in the writer process."
    )


class TenantConfig(_Section):
    """Per-tenant overrides."""

    slo_ms: float | None = Field(None, gt=0)
    slo_target: float | None = Field(None, gt=0, lt=1)
    stage_floor_ms: dict[str, float] = Field(default_factory=dict)
    stable_version: str | None = None
    canary_version: str | None = None


class OtelCollectorConfig(_Section):
    """The local OpenTelemetry Collector of ``ttft otel up`` (deploy/otel/collector.yaml): its loopback ports.

    Passed to the Collector as ``TTFT_OTEL__*`` variables, the names its config reads.
    """

    grpc_port: int = Field(4317, gt=0, le=65535, description="OTLP/gRPC receiver (services export here).")
    http_port: int = Field(4318, gt=0, le=65535, description="OTLP/HTTP receiver (POST /v1/traces).")
    prometheus_port: int = Field(8889, gt=0, le=65535, description="/metrics of the spanmetrics histograms.")
    telemetry_port: int = Field(8888, gt=0, le=65535, description="/metrics of the Collector's own telemetry.")
    auth_keys: str | None = Field(
        None,
        description="The JWKS file of the tenants' bearer tokens (`ttft otel keys`): set, `ttft otel up` runs the "
        "Collector with deploy/otel/auth.yaml, so every OTLP client needs its tenant's token and the tenant is "
        'the token\'s (docs/otlp-mapping.md, "Authenticated tenants").',
    )

    @model_validator(mode="after")
    def _distinct(self) -> OtelCollectorConfig:
        ports = self.ports()
        if len(set(ports.values())) != len(ports):
            raise ValueError("otel: the four Collector ports must differ")
        return self

    def ports(self) -> dict[str, int]:
        """The four ports by setting name."""
        return {
            "grpc_port": self.grpc_port,
            "http_port": self.http_port,
            "prometheus_port": self.prometheus_port,
            "telemetry_port": self.telemetry_port,
        }


class DashboardsConfig(_Section):
    """What the generated Grafana boards link to (``ttft grafana build`` writes it into dashboards/*.json)."""

    trace_url: str = Field(
        "http://localhost:16686/trace/{trace_id}",
        description="URL of one trace, {trace_id} replaced by the request's trace id: Jaeger "
        "(http://jaeger:16686/trace/{trace_id}) or Tempo through Grafana Explore (docs/grafana.md).",
    )

    @model_validator(mode="after")
    def _has_trace_id(self) -> DashboardsConfig:
        if "{trace_id}" not in self.trace_url:
            raise ValueError("dashboards.trace_url must contain {trace_id}")
        return self


class Settings(BaseSettings):
    """Everything a ttft process needs. Frozen; validated once at start-up."""

    model_config = SettingsConfigDict(
        env_prefix="TTFT_",
        env_nested_delimiter="__",
        frozen=True,
        extra="ignore",
        hide_input_in_errors=True,  # validation errors must never echo a password
    )

    home: Path = Field(Path(".ttft"), description="Local state: broker data, chDB store, worker data.")
    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None
    clickhouse_url: SecretStr | None = Field(
        None, description="chdb:///DIR (default: $TTFT_HOME/chdb) or http(s)://host:8123; may hold credentials."
    )
    clickhouse_database: str = "ttft"
    clickhouse_user: str | None = None
    clickhouse_password: SecretStr | None = None
    topic_prefix: str = "ttft"
    bound_tenants: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Tenants bound to their own input topic <prefix>.stage-events.<tenant> (comma-separated in "
        "the environment), consumed beside the shared topic: an event there claiming another tenant, or a bound "
        "tenant's event on the shared topic, is dead-lettered tenant_not_allowed. Append new tenants at the end: "
        "the position is the tenant's slot of the join's state (docs/operations.md, Bound producers).",
    )
    partitions: int = Field(8, gt=0, le=1024)
    replication_factor: int = Field(1, gt=0)
    alertmanager_url: SecretStr | None = Field(
        None, description="Alertmanager base URL, e.g. http://host:9093; may hold credentials."
    )
    config: Path | None = Field(None, description="YAML file with the sections below; env overrides it.")
    app_id: str = "ttft"
    metrics_port: int = Field(0, ge=0, le=65535, description="/metrics and /healthz; 0 picks a free port.")
    metrics_host: str = Field("127.0.0.1", description="Bind address of /metrics and /healthz; 0.0.0.0 in containers.")
    session_timeout_s: float = Field(10.0, gt=0)
    stop_timeout_s: float = Field(
        10.0, gt=0, description="ttft worker: children still running this long after SIGTERM are killed."
    )

    join: JoinConfig = JoinConfig()
    windows: WindowConfig = WindowConfig()
    caps: CapsConfig = CapsConfig()
    otlp: OtlpConfig = OtlpConfig()
    store: StoreConfig = StoreConfig()
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)
    tenancy: TenancyConfig = Field(
        default_factory=TenancyConfig, description="Registered tenants and the shared pool of all others."
    )
    default_slo_ms: float = Field(2_000.0, gt=0)
    default_slo_target: float = Field(0.99, gt=0, lt=1)
    rules: RulesConfig = Field(default_factory=RulesConfig, description="Alert rules (streams.rules_config).")
    otel: OtelCollectorConfig = Field(
        default_factory=OtelCollectorConfig, description="The local Collector's ports (ttft otel up)."
    )
    dashboards: DashboardsConfig = Field(
        default_factory=DashboardsConfig, description="What the Grafana boards link to (trace URL)."
    )
    paging_muted: bool = Field(False, description="Replay/backfill: store alerts, never page (counted).")
    replay: bool = Field(
        False,
        description=(
            "A replay's writer (set by ttft replay): no start-up recovery, so every window it re-closes is "
            "evaluated once, in event-time order, by a fresh rule engine (windows already stored included)."
        ),
    )

    @field_validator("topic_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", v):
            raise ValueError("topic_prefix must be a legal Kafka topic prefix")
        return v

    @field_validator("bound_tenants", mode="before")
    @classmethod
    def _split_bound(cls, v: Any) -> Any:
        if isinstance(v, str):
            return tuple(t.strip() for t in v.split(",") if t.strip())
        return v

    @field_validator("bound_tenants")
    @classmethod
    def _bound(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for tenant in v:
            if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", tenant) or tenant in (".", ".."):
                raise ValueError(f"bound tenant {tenant!r}: a bound tenant names a topic: use [A-Za-z0-9._-]{{1,64}}")
        if len(set(v)) != len(v):
            raise ValueError("bound_tenants lists a tenant twice")
        return v

    @field_validator("clickhouse_database")
    @classmethod
    def _database(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", v):
            raise ValueError("clickhouse_database must be an identifier")
        return v

    @model_validator(mode="after")
    def _cross(self) -> Settings:
        if self.kafka_security_protocol.startswith("SASL") and not self.kafka_sasl_mechanism:
            raise ValueError("kafka_sasl_mechanism is required with a SASL security protocol")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlSource(settings_cls))

    # --- derived values -------------------------------------------------------------------------

    def topic(self, name: str) -> str:
        """Full topic name for a logical name: ``stage-events`` -> ``ttft.stage-events``."""
        return f"{self.topic_prefix}.{name}"

    def bound_topics(self) -> dict[str, str]:
        """Each bound tenant's input topic -> the tenant, in ``bound_tenants`` order."""
        return {self.topic(f"stage-events.{tenant}"): tenant for tenant in self.bound_tenants}

    @property
    def store_url(self) -> str:
        """The ClickHouse URL, defaulting to an embedded chDB directory under ``home``."""
        if self.clickhouse_url is not None:
            return self.clickhouse_url.get_secret_value()
        return f"chdb://{(self.home / 'chdb').resolve()}"

    def slo_ms(self, tenant: str) -> float:
        t = self.tenants.get(tenant)
        return t.slo_ms if t is not None and t.slo_ms is not None else self.default_slo_ms

    def slo_target(self, tenant: str) -> float:
        t = self.tenants.get(tenant)
        return t.slo_target if t is not None and t.slo_target is not None else self.default_slo_target

    def registered_tenants(self) -> frozenset[str]:
        """The tenants registered by configuration (``tenancy.registered`` and the configured ``tenants``);
        steady ones are promoted besides them (streams.core.tenancy)."""
        return frozenset(self.tenancy.registered or ()) | frozenset(self.tenants)

    def required_stages(self, route: str | None) -> tuple[str, ...]:
        if route is not None and route in self.join.route_required_stages:
            return self.join.route_required_stages[route]
        return self.join.required_stages


TOPIC_NAMES: tuple[str, ...] = (
    "stage-events",
    "requests",
    "dead-letter",
    "stage-windows",
    "window-health",
    "alerts",
    "rule-evaluations",
)


class _YamlSource(PydanticBaseSettingsSource):
    """Reads the file named by ``TTFT_CONFIG`` (or the ``config`` init argument)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = self.current_state.get("config") or os.environ.get("TTFT_CONFIG")
        if not path:
            return {}
        return read_config_file(Path(path))


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a YAML config file into a mapping; errors name the file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ValueError(f"config file {path} does not exist") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping at the top level")
    return data


def load_settings(**overrides: Any) -> Settings:
    """Build the settings from keyword overrides, the environment and ``TTFT_CONFIG``."""
    return Settings(**overrides)


def _split_credentials(url: str) -> tuple[str, str, str] | None:
    """``(scheme://, userinfo, @host...)`` of a URL with credentials, else ``None``; never raises.

    Works on the text, not on a parse, so an unescaped ``/``, ``?``, ``#`` or ``@`` in a password, or a
    non-numeric port, cannot make the password look like a host or a path. The userinfo is everything
    between ``://`` and the last ``@`` of the authority (which ends at the first ``/``, ``?`` or ``#``).
    With no ``@`` there, an ``@`` further on still ends a userinfo if the authority looks like
    ``user:password`` rather than ``host:port`` (a password holding a ``/``, ``?`` or ``#``); then the
    userinfo runs to the last ``@`` of the URL. A numeric "port" (``user:2024/Secret@host``, a password
    starting with digits) is read the same way unless the ``@`` sits in a ``key=value`` query string after
    a path (``host:8443/?ca_cert=/a@b.pem``; not ``user:12?secret=@host``), or there is no host before it
    (``:12?secret=@host``): when in doubt, redact.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or not rest or rest[0] in "/?#":  # no authority, e.g. chdb:///abs/dir
        return None
    end = next((i for i, ch in enumerate(rest) if ch in "/?#"), len(rest))
    authority = rest[:end]
    if "@" in authority:
        at = authority.rfind("@")
    else:
        at = _userinfo_end(authority, rest)
        if at < 0:
            return None
    return scheme + sep, rest[:at], rest[at:]


def _userinfo_end(authority: str, rest: str) -> int:
    """Where in ``rest`` the ``@`` ending a userinfo beyond the authority is, else -1.

    ``user:password``-looking authorities: the last ``@``. ``user:<digits>``: the last ``@`` that is not
    inside a ``key=value`` query string.
    """
    if "@" not in rest or ":" not in authority or authority.startswith("["):
        return -1
    if _looks_like_userinfo(authority):
        return rest.rfind("@")
    for i in reversed([i for i, ch in enumerate(rest) if ch == "@"]):
        before, question, query = rest[:i].partition("?")
        # A query of settings follows a path (``host:8443/?ca_cert=/a@b.pem``); straight after the digits
        # (``user:12?secret=@host``) the "query" is more likely the password's.
        if not (question and "=" in query and "/" in before):
            return i
    # No host before the colon (``:12?secret=@host``) is no host:port: an empty user's password, to the last @.
    return rest.rfind("@") if authority.startswith(":") else -1


def _looks_like_userinfo(authority: str) -> bool:
    if authority.startswith("["):  # an IPv6 host: its colons are not a user:password separator
        return False
    _, colon, port = authority.rpartition(":")
    return bool(colon) and not port.isdigit() and port != ""


def redact_url(url: str) -> str:
    """Replace a password in a URL with ``***`` so it can be logged (the user name stays)."""
    split = _split_credentials(url)
    if split is None:
        return url
    prefix, userinfo, host = split
    user = userinfo.partition(":")[0]
    return f"{prefix}{user}:***{host}" if user else f"{prefix}***{host}"


def redact_password(text: str, url: str) -> str:
    """``text`` (say, an error message about ``url``) with the password of ``url`` replaced by ``***``."""
    split = _split_credentials(url)
    if split is None:
        return text
    _, colon, password = split[1].partition(":")
    if not colon or not password:
        return text
    for secret in sorted({password, unquote(password)}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def settings_summary(settings: Settings) -> Mapping[str, str]:
    """Human-readable, secret-free view of the main settings (for logs and `ttft config check`)."""
    return {
        "home": str(settings.home),
        "kafka_bootstrap": settings.kafka_bootstrap,
        "clickhouse": redact_url(settings.store_url),
        "database": settings.clickhouse_database,
        "topic_prefix": settings.topic_prefix,
        "partitions": str(settings.partitions),
        "alertmanager": redact_url(settings.alertmanager_url.get_secret_value() if settings.alertmanager_url else "-"),
        "otlp": f"{settings.otlp.topic} ({settings.otlp.encoding})" if settings.otlp.enabled else "off",
        "store_http": _store_http_summary(settings),
    }


def _store_http_summary(settings: Settings) -> str:
    """Where the writer serves the embedded store (read-only ClickHouse HTTP), or why it does not."""
    if not settings.store_url.startswith("chdb:"):
        return "off (the store is a ClickHouse server)"
    if settings.store.http_port == 0:
        return "off (store.http_port = 0)"
    password = "a password" if settings.store.http_password is not None else "no password"
    return f"http://{settings.store.http_host}:{settings.store.http_port} from the writer (user default, {password})"
