"""The service helper, re-exported from the ``ttft-emit`` distribution (``emitter/``, package ``ttft_emit``).

Services install ``ttft-emit`` alone (aiokafka and orjson, Python >= 3.9); this module keeps
``from streams.emit import StageEmitter`` working inside the pipeline's own code, tools and tests.
Usage: ``docs/emitting.md``.
"""

from __future__ import annotations

from ttft_emit import (
    DEFAULT_TOPIC,
    EmitterStats,
    RequestTiming,
    Rollout,
    StageEmitter,
    StageSpan,
    ThreadedStageEmitter,
    event_json,
)

__all__ = [
    "DEFAULT_TOPIC",
    "EmitterStats",
    "RequestTiming",
    "Rollout",
    "StageEmitter",
    "StageSpan",
    "ThreadedStageEmitter",
    "event_json",
]
