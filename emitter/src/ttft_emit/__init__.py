"""ttft-emit: publish the per-stage timing events of LLM/RAG requests to Kafka for ttft-pipeline.

Two emitters with one request path (bounded buffer, oldest dropped with a counter when Kafka is away,
monotonic clock for durations, never blocks and never raises into the service):

- :class:`StageEmitter` for asyncio services: the sender is a task on the service's event loop;
- :class:`ThreadedStageEmitter` for synchronous ones (WSGI, threads): the sender is one daemon thread.

Usage and the raw event contract for other languages: ``docs/emitting.md`` in the ttft-pipeline
repository.
"""

from ttft_emit.asyncio_emitter import StageEmitter
from ttft_emit.buffer import EmitterStats
from ttft_emit.event import DEFAULT_TOPIC, Rollout, event_json
from ttft_emit.threaded import ThreadedStageEmitter
from ttft_emit.timing import RequestTiming, StageSpan

__version__ = "0.1.0"

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
