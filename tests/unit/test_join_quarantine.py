import asyncio
from dataclasses import replace
from typing import Any

import orjson
from aiokafka import ConsumerRecord, TopicPartition

from streams.alerting.outbox import DeliveryState, alert_message
from streams.app.join_guard import QUARANTINE_ALERT, quarantine_transition
from streams.core.guard import PRODUCER, TENANT, Source
from streams.settings import load_settings
from streams.views.quarantines import fold_quarantines, quarantine_lines
from tests.support.fake_kafka import FakeProducer
from tests.unit.test_batches import T0, complete_request, join_rig

TOPIC = "u.stage-events"


def garbage(offset: int, partition: int = 3, producer: bytes | None = None) -> ConsumerRecord[bytes, bytes]:
    headers = [("ttft-producer", producer)] if producer is not None else []
    return ConsumerRecord(TOPIC, partition, offset, int(T0), 0, b"k", b"{not json", None, 0, 0, headers)  # type: ignore[call-arg]


def alerts(producer: FakeProducer) -> list[dict[str, Any]]:
    return [orjson.loads(v or b"") for _, _, v in producer.values("u.alerts")]


def test_unparseable_flood_on_one_partition_is_quarantined_and_the_batch_committed() -> None:
    producer = FakeProducer()
    rig = join_rig(producer, caps={"halt_window_messages": 100, "quarantine_release_messages": 300})
    good = complete_request(10)[TopicPartition(TOPIC, 3)]
    flood = [garbage(100 + i) for i in range(2_000)]
    asyncio.run(rig.runner.process({rig.tp: [*good, *flood]}))
    assert rig.consumer.commits == [{rig.tp: 2_100}]  # nothing held back, no exit
    assert producer.values("u.requests")  # the good request was still joined
    assert len(producer.values("u.dead-letter")) == 2_000  # every bad message dead-lettered: nothing lost
    [page] = alerts(producer)
    assert page["alertname"] == QUARANTINE_ALERT and page["state"] == "firing"
    assert page["labels"] == {
        "alertname": QUARANTINE_ALERT,
        "severity": "page",
        "tenant": "",
        "source": "partition 3 (no producer header)",
    }
    assert page["annotations"]["runbook_url"].endswith("#ttftsourcequarantined")
    health = rig.fold.metrics.health
    assert [q["source"] for q in health["quarantined_sources"]] == ["partition 3 (no producer header)"]
    assert rig.fold.metrics.quarantined_sources.labels("producer")._value.get() == 1
    [line] = quarantine_lines(fold_quarantines(v for _, _, v in producer.values("u.alerts")))
    assert line.startswith("QUARANTINED partition 3 (no producer header) since ")

    # Still flooding: no second page. Then fixed: released once, the page resolves.
    asyncio.run(rig.runner.process({rig.tp: [garbage(2_100 + i) for i in range(500)]}))
    assert len(alerts(producer)) == 1
    fixed = [complete_request(3_000 + 10 * i)[TopicPartition(TOPIC, 3)] for i in range(80)]
    asyncio.run(rig.runner.process({rig.tp: [r for request in fixed for r in request]}))
    states = [(a["state"], a["fingerprint"]) for a in alerts(producer)]
    assert [s for s, _ in states] == ["firing", "resolved"] and states[0][1] == states[1][1]
    assert health["quarantined_sources"] == []
    assert fold_quarantines([b"not json", *(v for _, _, v in producer.values("u.alerts"))]) == []


def test_a_producer_that_names_itself_is_quarantined_alone() -> None:
    producer = FakeProducer()
    rig = join_rig(producer, caps={"halt_window_messages": 100})
    flood = [garbage(100 + i, producer=b"batch-importer") for i in range(300)]
    asyncio.run(rig.runner.process({rig.tp: flood}))
    [page] = alerts(producer)
    assert page["labels"]["source"] == "producer 'batch-importer'"  # one page on whichever partitions
    assert page["claim"] == {"holder": "3", "kind": "producer", "name": "batch-importer", "partition": "3"}


# --- one page per source, whoever holds it, across restarts (issue 27 item 4's loose ends) -------------


def worker(producer: FakeProducer, partitions: tuple[int, ...], **caps: Any) -> Any:
    rig = join_rig(producer, caps={"halt_window_messages": 100, "quarantine_release_messages": 300, **caps})
    rig.runner.owned = {TopicPartition(TOPIC, p) for p in partitions}
    return rig


def flood(rig: Any, partition: int, first: int, n: int = 300, name: bytes | None = b"svc") -> None:
    tp = TopicPartition(TOPIC, partition)
    asyncio.run(rig.runner.process({tp: [garbage(first + i, partition, name) for i in range(n)]}))


def clean(rig: Any, partition: int, first: int, requests: int = 60) -> None:
    tp = TopicPartition(TOPIC, partition)
    fetch = [complete_request(first + 10 * i)[TopicPartition(TOPIC, 3)] for i in range(requests)]
    records = [
        ConsumerRecord(TOPIC, partition, r.offset, r.timestamp, 0, r.key, r.value, None, 0, 0, [])  # type: ignore[call-arg]
        for request in fetch
        for r in request
    ]
    asyncio.run(rig.runner.process({tp: records}))


def pages(*producers: FakeProducer) -> list[tuple[str, str]]:
    """What Alertmanager is told, folding every worker's claims as the delivery loop does."""
    state = DeliveryState()
    told: list[tuple[str, str]] = []
    for producer in producers:
        for _, _, value in producer.values("u.alerts"):
            state.fold_message(value)
            told += [(d.transition.state, d.transition.labels["source"]) for d in state.due(0.0, 60.0) if not d.resend]
            state.mark_delivered(state.due(0.0, 60.0), 0.0)
    return told


def test_two_workers_quarantining_the_same_producer_page_once_and_resolve_once() -> None:
    """Item 2: workers A (partitions 0, 1) and B (2, 3) each quarantine producer 'svc' on their partition:
    one alert (identity = the source, not the worker), firing once; A's release alone resolves nothing."""
    shared = FakeProducer()
    a, b = worker(shared, (0, 1)), worker(shared, (2, 3))
    flood(a, 1, 100)
    flood(b, 3, 100)
    fired = alerts(shared)
    assert [(m["state"], m["claim"]["holder"]) for m in fired] == [("firing", "1"), ("firing", "3")]
    assert len({m["fingerprint"] for m in fired}) == 1
    assert pages(shared) == [("firing", "producer 'svc'")]
    [held] = fold_quarantines(v for _, _, v in shared.values("u.alerts"))
    assert (held.source, held.holders) == ("producer 'svc'", ("1", "3"))
    assert "(held on partitions 1, 3)" in quarantine_lines([held])[0]
    clean(a, 1, 1_000)  # fixed where A reads it: A's claim resolves, B still holds the page
    assert [m["state"] for m in alerts(shared)] == ["firing", "firing", "resolved"]
    assert pages(shared) == [("firing", "producer 'svc'")]
    assert [q.holders for q in fold_quarantines(v for _, _, v in shared.values("u.alerts"))] == [("3",)]
    clean(b, 3, 1_000)
    assert pages(shared) == [("firing", "producer 'svc'"), ("resolved", "producer 'svc'")]
    assert fold_quarantines(v for _, _, v in shared.values("u.alerts")) == []


def test_a_restarted_worker_holds_its_quarantines_again_without_a_second_page() -> None:
    """Item 1: the quarantine outlives the join's memory. A restarted worker reads the firing claims of its
    partitions from ttft.alerts, holds them again (health, metrics), pages nothing while the flood goes on,
    and resolves the page once the source is fixed."""
    before = FakeProducer()
    first = worker(before, (2, 3))
    flood(first, 3, 100, name=None)
    assert pages(before) == [("firing", "partition 3 (no producer header)")]

    after = FakeProducer()
    second = worker(after, (2, 3))  # kill -9, restart: nothing in memory
    held = second.fold.quarantines.restore({2, 3}, [v for _, _, v in before.values("u.alerts")])
    assert [s.describe() for s in held] == ["partition 3 (no producer header)"]
    health = second.fold.metrics.health["quarantined_sources"]
    assert [(q["source"], q["partitions"]) for q in health] == [("partition 3 (no producer header)", [3])]
    assert second.fold.metrics.quarantined_sources.labels("producer")._value.get() == 1
    flood(second, 3, 400, n=500, name=None)  # still broken: dead-lettered, no second page
    assert alerts(after) == []
    assert len(after.values("u.dead-letter")) == 500
    clean(second, 3, 1_000)
    assert pages(before, after) == [
        ("firing", "partition 3 (no producer header)"),
        ("resolved", "partition 3 (no producer header)"),
    ]


def test_a_revoked_partition_leaves_its_claim_to_the_next_owner() -> None:
    """A rebalance moves partition 3: the old owner forgets its quarantine without resolving it, the new
    owner holds it again, and a tenant quarantined on two workers' partitions pages once."""
    shared = FakeProducer()
    old = worker(shared, (2, 3))
    flood(old, 3, 100, name=None)
    old.fold.revoke({TopicPartition(TOPIC, 3)})
    assert old.fold.guard.quarantined == {} and old.fold.metrics.health["quarantined_sources"] == []
    new = worker(shared, (3,))
    assert new.fold.quarantines.restore({3}, [v for _, _, v in shared.values("u.alerts")])
    assert new.fold.guard.is_quarantined(None, 3, None)
    assert [m["state"] for m in alerts(shared)] == ["firing"]  # nothing resolved, nothing paged again


# --- bound producers (issue 27 item 7) ---------------------------------------------------------------

BOUND = "u.stage-events.acme"


def bound_records(topic: str, tenant: str, first_offset: int, rid: str) -> list[ConsumerRecord[bytes, bytes]]:
    records = complete_request(first_offset)[TopicPartition(TOPIC, 3)]
    out = []
    for r in records:
        original = orjson.loads(r.value)
        event = {**original, "tenant_id": tenant, "request_id": f"{rid}-{original['request_id']}"}
        key, value = event["request_id"].encode(), orjson.dumps(event)
        out.append(ConsumerRecord(topic, 3, r.offset, r.timestamp, 0, key, value, None, 0, 0, []))  # type: ignore[call-arg]
    return out


def test_a_bound_topic_carries_its_tenant_only_and_its_tenant_comes_from_it_only() -> None:
    from streams.app.join_fold import join_runner_config

    producer = FakeProducer()
    rig = join_rig(producer, bound_tenants=("acme",))
    config = join_runner_config(rig.fold.settings)
    assert config.topics == (TOPIC, BOUND) and config.changelog_partitions == 16
    bound_tp = TopicPartition(BOUND, 3)
    rig.runner.owned = {rig.tp, bound_tp}
    fetch = {
        bound_tp: [*bound_records(BOUND, "acme", 10, "own"), *bound_records(BOUND, "globex", 20, "forged")],
        rig.tp: [*bound_records(TOPIC, "acme", 10, "sneaked"), *bound_records(TOPIC, "initech", 20, "shared")],
    }
    asyncio.run(rig.runner.process(fetch))
    stored = {orjson.loads(v or b"")["request_id"] for _, _, v in producer.values("u.requests") if k_is_record(v)}
    assert stored == {"own-r1", "shared-r1"}
    letters = [orjson.loads(v or b"") for _, _, v in producer.values("u.dead-letter")]
    assert {(d["request_id"].split("-")[0], d["reason_code"], d["tenant_id"]) for d in letters} == {
        ("forged", "tenant_not_allowed", "acme"),
        ("sneaked", "tenant_not_allowed", None),
    }
    assert len(letters) == 12  # every event of both requests, each with its own bytes
    # The bound topic's partition 3 is the core's partition 8 + 3: its own state and watermark.
    assert {p for p, _, _ in producer.values(rig.changelog)} == {3, 11}


def k_is_record(value: bytes | None) -> bool:
    return b'"request_id"' in (value or b"")


def test_pages_fired_before_claims_are_resolved_once_by_the_owner_of_their_partition() -> None:
    """An upgrade: a page fired before claims has no holder, so nothing would ever resolve it. The join that
    owns its partition (partition 0's owner for a tenant's) resolves it at its next fetch."""
    settings = load_settings(topic_prefix="u")
    old = [
        quarantine_transition(settings, Source(PRODUCER, "svc", 3), "firing", T0),
        quarantine_transition(settings, Source(TENANT, "acme"), "firing", T0),
    ]
    old_labels = {**old[0].labels, "source": "partition 3 producer 'svc'"}  # the identity before claims
    old[0] = replace(old[0], labels=old_labels)
    topic = [alert_message(t)[1] for t in old]
    assert all(b'"claim"' not in v for v in topic)
    producer = FakeProducer()
    rig = worker(producer, (2, 3))
    assert rig.fold.quarantines.restore({2, 3}, topic) == []  # nothing held: judged anew
    asyncio.run(rig.runner.process({}))  # the next fetch, even an empty one
    assert [(m["state"], m["labels"]["source"]) for m in alerts(producer)] == [
        ("resolved", "partition 3 producer 'svc'")
    ]
    other = FakeProducer()
    zero = worker(other, (0,))
    zero.fold.quarantines.restore({0}, topic)
    asyncio.run(zero.runner.process({}))
    assert [(m["state"], m["labels"]["tenant"]) for m in alerts(other)] == [("resolved", "acme")]
    state = DeliveryState()
    for value in [
        *topic,
        *(v for _, _, v in producer.values("u.alerts")),
        *(v for _, _, v in other.values("u.alerts")),
    ]:
        state.fold_message(value)
    assert state.firing == {}
    asyncio.run(rig.runner.process({}))
    assert len(alerts(producer)) == 1  # once


def test_a_page_from_before_claims_resolved_late_leaves_a_claimed_page_firing() -> None:
    settings = load_settings(topic_prefix="u")
    source = Source(TENANT, "acme")
    legacy = quarantine_transition(settings, source, "firing", T0)
    claimed = quarantine_transition(settings, source, "firing", T0 + 1, holder=1)
    late = quarantine_transition(settings, source, "resolved", T0 + 2, T0)
    state = DeliveryState()
    for t in (legacy, claimed, late):
        state.fold_message(alert_message(t)[1])
    assert [(d.transition.state, d.transition.claim) for d in state.due(0.0, 60.0)] == [("firing", None)]
