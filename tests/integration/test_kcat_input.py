"""kcat, a real and independent (librdkafka) Kafka client, produces the pipeline's input.

Three kcat runs write to ``<prefix>.stage-events`` from files, then the real join and writer store it:

A. the ground-truth traffic of :func:`build_traffic` (duplicates, missing stages, orphans, malformed values)
   plus hand-made hostile values (newlines, CR, tab, NUL, the key delimiter, invalid UTF-8, empty), and a
   few requests whose events are pretty-printed over several lines: ``-K`` and ``-D`` are single bytes
   chosen so that neither can split a message (kcat 1.7.1 cuts at the *first* key delimiter and at *every*
   message delimiter, and drops empty chunks), ``-X partitioner=murmur2_random`` as documented;
B. kcat's defaults (no ``-K``, newline-delimited): valid events without a key are dead-lettered
   ``invalid_key``, and a pretty-printed event is torn into one ``invalid_json`` letter per line;
C. the line form the docs give (``-K '\\t'``, one compact JSON event per line), including an empty key, a
   wrong key and a line without the tab.

A raw aiokafka read-back proves every message arrived byte-exact, on the partition the Java client and
aiokafka would choose; then the stored records equal the truth and every bad message is a dead letter with
its reason, its exact bytes and its offset.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.partitioner import DefaultPartitioner

from streams.ports import free_port
from tests.support.pipeline import Pipeline, pipeline_drained, pipeline_env, topic_partitions
from tests.support.traffic import build_traffic, wrong_values

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(300)]

N_REQUESTS = 600
KCAT_TIMEOUT_S = 60.0
MISSING_KEY = "Kafka key is missing; it must be the request_id in UTF-8"

Message = tuple[bytes | None, bytes]


def _expected_reason(key: bytes | None, value: bytes) -> str | None:
    """The dead-letter reason the contract gives a message of this test, or None for a valid event.

    The test's own valid events all carry ``event_id``; the malformed ones of build_traffic and of this
    file are recognised by construction, not by the pipeline's decoder."""
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return "not_utf8"
        return "invalid_json"
    if not isinstance(parsed, dict) or "event_id" not in parsed:
        return "schema"
    if key != parsed["request_id"].encode():
        return "invalid_key"
    return None


def _pick_byte(chunks: list[bytes], preferred: int, avoid: bytes = b"") -> int:
    """A delimiter byte that occurs in none of ``chunks``: ``preferred`` if possible, never NUL (kcat parses
    ``-D``/``-K`` as C strings)."""
    seen: set[int] = set().union(*(set(c) for c in chunks))
    for byte in (preferred, 0x1E, 0x1F, 0x1D, 0x1C, *range(1, 256)):
        if byte not in seen and byte not in avoid:
            return int(byte)
    raise AssertionError("every byte occurs in the messages: no single-byte kcat delimiter is safe")


def _frame(messages: list[Message], key_delim: bytes | None, msg_delim: bytes) -> bytes:
    out = bytearray()
    for key, value in messages:
        if key is not None:
            assert key_delim is not None
            out += key + key_delim
        out += value + msg_delim
    return bytes(out)


def _kcat_split(data: bytes, key_delim: bytes | None, msg_delim: bytes) -> list[Message]:
    """What kcat 1.7.1 ``-P -l`` makes of ``data``: a message per chunk between message delimiters, empty
    chunks dropped; with ``-K`` the key is what precedes the first key delimiter (no delimiter: NULL key,
    the whole chunk is the value; no ``-Z``: an empty key stays an empty key)."""
    out: list[Message] = []
    for chunk in data.split(msg_delim):
        if not chunk:
            continue
        if key_delim is not None and key_delim in chunk:
            key, _, value = chunk.partition(key_delim)
            out.append((key, value))
        else:
            out.append((None, chunk))
    return out


def _kcat_arg(byte: int) -> str:
    # "\xNN" with exactly two hex digits and nothing after it: kcat's parser reads as many hex digits as
    # follow, so "\x1eA" would be the byte 0xEA.
    return f"\\x{byte:02x}"


def _produce_with_kcat(kcat: str, bootstrap: str, topic: str, path: Path, args: list[str]) -> float:
    """Run ``kcat -P -l path`` with ``args``; returns its seconds. Fails with kcat's stderr."""
    cmd = [kcat, "-P", "-b", bootstrap, "-t", topic, *args, "-l", str(path)]
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=KCAT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"kcat did not finish in {KCAT_TIMEOUT_S} s: {cmd}") from exc
    seconds = time.monotonic() - started
    assert done.returncode == 0, f"{cmd} exited {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}"
    return seconds


async def _read_back(bootstrap: str, topic: str, expected: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every message of ``topic`` as (partition, offset, key, value), read without a consumer group."""
    tps = await topic_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        assert sum(ends.values()) == expected, f"the topic holds {sum(ends.values())} messages, not {expected}"
        deadline = time.monotonic() + 30
        while len(out) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                out += [(m.partition, m.offset, m.key, m.value) for m in messages]
    finally:
        await consumer.stop()
    return out


def _event(rid: str, stage: str, ts_ms: float, **extra: Any) -> bytes:
    body = {"request_id": rid, "tenant_id": "acme", "stage": stage, "ts_ms": ts_ms, "event_id": f"{rid}-{stage}"}
    return orjson.dumps({**body, **extra})


def test_kcat_produced_input_is_joined_exactly(kcat: str, kafka_settings: Any, tmp_path: Path) -> None:
    bootstrap, topic = kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events")
    now = time.time() * 1000

    # A: the ground truth, some requests pretty-printed (valid JSON over several lines), hostile values.
    traffic = build_traffic(N_REQUESTS, start_ms=now - 60_000, malformed_share=0.05, prefix="kcat")
    pretty_ids = {f"kcat-{i:06d}".encode() for i in range(0, N_REQUESTS, 97)}
    run_a: list[Message] = []
    for key, value in traffic.messages:
        if key in pretty_ids and _expected_reason(key, value) is None:
            value = orjson.dumps(orjson.loads(value), option=orjson.OPT_INDENT_2)
        run_a.append((key, value))
    run_a += [
        (b"kcat-h-0", b'{"request_id": "kcat-h-0",\n"tenant_id": "acme",\r\n"stage": '),
        (b"kcat-h-1", b"\x00\x1f\t\n\xff binary \x1f\x1f\r\n"),
        (b"kcat-h-2", b""),
        (b"kcat-h-3", b"\n"),
        (b"kcat-h-4", b"\r\n\t{}\n"),
    ]
    assert sum(b"\n" in v for _, v in run_a) > 10
    keys = [k for k, _ in run_a if k is not None]
    key_delim = bytes([_pick_byte(keys, 0x1F)])  # ASCII unit separator
    msg_delim = bytes([_pick_byte([k + key_delim + v for k, v in run_a if k is not None], 0x1E, key_delim)])
    data_a = _frame(run_a, key_delim, msg_delim)
    assert _kcat_split(data_a, key_delim, msg_delim) == run_a, "the delimiters would not split the file exactly"
    (tmp_path / "a.kcat").write_bytes(data_a)

    # B: kcat's defaults: no key, one message per line.
    nokey = [_event("kcat-nokey", stage, now - 30_000) for stage in ("request_start", "first_token")]
    pretty = orjson.dumps(
        orjson.loads(_event("kcat-pretty", "request_start", now - 30_000)), option=orjson.OPT_INDENT_2
    )
    run_b: list[Message] = [(None, v) for v in [*nokey, *(line for line in pretty.split(b"\n") if line)]]
    data_b = b"".join(v + b"\n" for v in nokey) + pretty + b"\n"
    assert _kcat_split(data_b, None, b"\n") == run_b
    (tmp_path / "b.kcat").write_bytes(data_b)

    # C: the documented line form, `request_id<TAB>compact JSON<LF>`, and three key mistakes.
    lines = build_traffic(12, seed=11, start_ms=now - 40_000, malformed_share=0.0, prefix="kcat-tab")
    run_c: list[Message] = [*lines.messages]
    run_c += [
        (b"", _event("kcat-emptykey", "request_start", now - 30_000)),
        (b"kcat-wrong", _event("kcat-wrongkey", "request_start", now - 30_000)),
        (None, _event("kcat-notab", "request_start", now - 30_000)),
    ]
    data_c = _frame(run_c, b"\t", b"\n")
    assert _kcat_split(data_c, b"\t", b"\n") == run_c
    (tmp_path / "c.kcat").write_bytes(data_c)

    truth = {**traffic.truth, **lines.truth}
    produced = run_a + run_b + run_c
    expected_letters = Counter(r for k, v in produced if (r := _expected_reason(k, v)) is not None)
    assert expected_letters["invalid_key"] == 5 and expected_letters["not_utf8"] >= 1

    pipe = Pipeline(pipeline_env(kafka_settings, tmp_path), tmp_path)
    murmur2 = ["-X", "partitioner=murmur2_random"]
    try:
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)
        seconds = [
            _produce_with_kcat(
                kcat, bootstrap, topic, tmp_path / "a.kcat",
                [*murmur2, "-K", _kcat_arg(key_delim[0]), "-D", _kcat_arg(msg_delim[0])],
            ),
            _produce_with_kcat(kcat, bootstrap, topic, tmp_path / "b.kcat", []),
            _produce_with_kcat(kcat, bootstrap, topic, tmp_path / "c.kcat", [*murmur2, "-K", "\\t"]),
        ]  # fmt: skip
        print(f"kcat runs: {', '.join(f'{s:.2f} s' for s in seconds)} for {len(produced)} messages")

        # Byte-exact, nothing lost or added, keyed messages on the Java client's (murmur2) partition, and
        # per partition in the order of the files.
        back = asyncio.run(_read_back(bootstrap, topic, len(produced)))
        assert Counter((k, v) for _, _, k, v in back) == Counter(produced)
        n = kafka_settings.partitions
        by_partition: dict[int, list[Message]] = {}
        for key, value in produced:
            if key:
                by_partition.setdefault(DefaultPartitioner()(key, list(range(n)), list(range(n))), []).append(
                    (key, value)
                )
        for p in range(n):
            got = [(k, v) for part, _, k, v in sorted(back, key=lambda m: m[1]) if part == p and k]
            assert got == by_partition.get(p, []), f"partition {p}: kcat's keyed messages differ from murmur2's"
        at = {(p, o): (k, v or b"") for p, o, k, v in back}  # None is no value above: the Counters differ

        pipe.wait_for(lambda: pipeline_drained(kafka_settings, join), 120, "the pipeline to drain")
        assert join.alive() and writer.alive()
        assert pipe.stop(join) == 0 and pipe.stop(writer) == 0
    finally:
        pipe.stop_all()

    rows = pipe.query("SELECT * FROM {db}.requests FINAL")
    by_id: dict[str, dict[str, Any]] = {}
    for row in rows:
        assert row["request_id"] not in by_id, f"double-counted {row['request_id']}"
        by_id[row["request_id"]] = row
    assert set(by_id) == set(truth), f"lost {set(truth) - set(by_id)}, unexpected {set(by_id) - set(truth)}"
    wrong = wrong_values(by_id, truth)
    assert not wrong, f"{len(wrong)} wrong values, e.g. {wrong[:10]}"

    letters = pipe.query(
        "SELECT source_partition AS p, source_offset AS o, reason_code, detail, hex(original) AS original_hex, "
        "original_length FROM {db}.dead_letters FINAL"
    )
    got_letters = {(d["p"], d["o"]): d for d in letters}
    assert len(got_letters) == len(letters)
    want = {(p, o): r for (p, o), (k, v) in at.items() if (r := _expected_reason(k, v)) is not None}
    assert {po: d["reason_code"] for po, d in got_letters.items()} == want
    assert Counter(want.values()) == expected_letters
    for po, letter in got_letters.items():
        key, value = at[po]
        assert bytes.fromhex(letter["original_hex"]) == value and letter["original_length"] == len(value), letter
        if letter["reason_code"] == "invalid_key" and key is None:
            assert letter["detail"] == MISSING_KEY, letter
        elif letter["reason_code"] == "invalid_key":
            assert f"Kafka key {key!r} is not the request_id" in letter["detail"], letter
