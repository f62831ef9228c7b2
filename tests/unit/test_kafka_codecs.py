"""Every Kafka codec is readable where the workers run: producers compress with gzip, snappy, lz4 or zstd
(librdkafka, the Java client, the Collector's Kafka exporter), and aiokafka reads the last three only with
``cramjam``, which the ``aiokafka[lz4,snappy,zstd]`` requirement brings. A missing codec used to end the join
on the first such batch, again after every restart (tests/integration/test_compressed_input.py)."""

from __future__ import annotations

from aiokafka import codec


def test_every_codec_is_installed() -> None:
    missing = [name for name in ("gzip", "snappy", "lz4", "zstd") if not getattr(codec, f"has_{name}")()]
    assert not missing, f"aiokafka cannot read {missing} batches: install aiokafka[lz4,snappy,zstd] (cramjam)"


def test_each_codec_round_trips() -> None:
    payload = b'{"request_id":"r1","tenant_id":"acme","stage":"retrieval","ts_ms":1.0}' * 20
    for name in ("gzip", "snappy", "lz4", "zstd"):
        encode, decode = getattr(codec, f"{name}_encode"), getattr(codec, f"{name}_decode")
        assert decode(encode(payload)) == payload, name
