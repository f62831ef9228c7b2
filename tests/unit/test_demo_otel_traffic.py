from __future__ import annotations

import time

from streams.demo.otel_traffic import STREAM_TAIL_MS, otel_requests, request_spec
from streams.demo.plan import OTEL_DEMO_TENANTS, OTEL_TENANT


def test_the_instrumented_service_plays_each_request_with_the_story_times_and_no_ttft_attribute() -> None:
    now_ms = time.time() * 1000.0
    requests = list(otel_requests(30.0, now_ms, 7, OTEL_TENANT, OTEL_DEMO_TENANTS))
    assert len(requests) > 200
    fallbacks = hits = 0
    for _done_ms, events in requests:
        spec = request_spec(events)
        by_stage = {e["stage"]: e for e in events}
        assert spec["start"] == by_stage["request_start"]["ts_ms"]
        assert spec["version"] == by_stage["request_start"]["version_id"]
        assert spec["model"] == by_stage["request_start"]["route"] in ("main", "fast")
        llm = sorted([e["ts_ms"], e["duration_ms"]] for e in events if e["stage"] == "llm_ttft")
        assert spec["llm"] == llm
        last_start, last_duration = llm[-1]
        assert spec["end"] >= max(last_start + last_duration + STREAM_TAIL_MS, by_stage["first_token"]["ts_ms"])
        for stage, key in (("retrieval", "retrieval"), ("vector_recall", "vector"), ("rerank", "rerank")):
            if stage in by_stage:
                assert spec[key] == [by_stage[stage]["ts_ms"], by_stage[stage]["duration_ms"]]
            else:
                assert key not in spec
        assert spec["prompt"] == [by_stage["prompt_assemble"]["ts_ms"], by_stage["prompt_assemble"]["duration_ms"]]
        assert spec["prompt_tokens"] == by_stage["llm_ttft"]["attrs"]["prompt_tokens"]
        assert not [k for k in spec if k.startswith("ttft")]
        fallbacks += len(llm) > 1
        hits += "vector" not in spec
    assert fallbacks > 0 and hits > 0  # the story has both: a failed first LLM attempt, a retrieval-cache hit
