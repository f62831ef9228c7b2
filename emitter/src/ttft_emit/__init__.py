"""ttft-emit: publish the per-stage timing events of LLM/RAG requests to Kafka for ttft-pipeline.

Two emitters with one request path (bounded buffer, oldest dropped with a counter when Kafka is away,
monotonic clock for durations, never blocks and never raises into the service):

- :class:`StageEmitter` for asyncio services: the sender is a task on the service's event loop;
- :class:`ThreadedStageEmitter` for synchronous ones (WSGI, threads): the sender is one daemon thread.

``ttft_emit.otel`` (imported on its own, with OpenTelemetry's SDK only) sets the first chunk on the LLM
spans of instrumentations that record none.

Usage and the raw event contract for other languages: ``docs/emitting.md`` in the ttft-pipeline
repository.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ttft_emit.asyncio_emitter import StageEmitter
    from ttft_emit.buffer import EmitterStats
    from ttft_emit.event import DEFAULT_TOPIC, Rollout, event_json
    from ttft_emit.threaded import ThreadedStageEmitter
    from ttft_emit.timing import RequestTiming, StageSpan

__version__ = "0.1.0"

#: Name -> its module, imported on first use: ``ttft_emit.otel`` alone (a service that only times first
#: chunks on its OpenTelemetry spans) never imports aiokafka or orjson.
_LAZY = {
    "StageEmitter": "ttft_emit.asyncio_emitter",
    "EmitterStats": "ttft_emit.buffer",
    "DEFAULT_TOPIC": "ttft_emit.event",
    "Rollout": "ttft_emit.event",
    "event_json": "ttft_emit.event",
    "ThreadedStageEmitter": "ttft_emit.threaded",
    "RequestTiming": "ttft_emit.timing",
    "StageSpan": "ttft_emit.timing",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ttft_emit' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_TOPIC",
    "EmitterStats",
    "RequestTiming",
    "Rollout",
    "StageEmitter",
    "StageSpan",
    "ThreadedStageEmitter",
    "__version__",
    "event_json",
]
