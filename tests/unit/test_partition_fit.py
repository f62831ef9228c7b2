"""streams/app/partition_fit.py: a worker's partition count follows its input topics, except with bound topics
(tests/integration/test_partition_counts.py runs the join on grown topics)."""

from __future__ import annotations

import pytest

from streams.app.partition_fit import PartitionsMismatch, fitted, input_topics_of
from streams.settings import load_settings


def test_the_largest_input_topic_sets_the_count() -> None:
    settings = load_settings(partitions=8)
    assert fitted(settings, {"ttft.stage-events": 8, "otlp_spans": 4}) is settings
    assert fitted(settings, {}) is settings
    grown = fitted(settings, {"ttft.stage-events": 8, "otlp_spans": 16})
    assert grown.partitions == 16 and settings.partitions == 8


def test_bound_topics_stop_the_worker_with_the_setting_to_use() -> None:
    settings = load_settings(partitions=8, bound_tenants=("acme",))
    with pytest.raises(PartitionsMismatch, match="set TTFT_PARTITIONS=12 on every worker"):
        fitted(settings, {settings.topic("stage-events"): 12})


def test_each_role_reads_its_own_topics() -> None:
    settings = load_settings(bound_tenants=("acme",))
    join = input_topics_of(settings, "join")
    assert join[0] == settings.topic("stage-events") and len(join) == 2 + settings.otlp.enabled
    assert input_topics_of(settings, "writer") == [settings.topic("requests"), settings.topic("dead-letter")]
