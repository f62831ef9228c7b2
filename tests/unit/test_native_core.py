"""The mypyc build of the join's core: used when current, never when stale, and folding exactly like the source.

``make setup`` compiles it (streams/native_build.py); these tests prove that the pipeline the suite runs is
the compiled one, and that the compiled modules and the Python source give byte-identical outputs on
traffic with duplicates, missing stages, orphans, malformed messages, restarts from the changelog state
and evictions under small caps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import streams.core.join as join_module
from streams.core import native
from tests.support.pipeline import REPO
from tests.support.traffic import build_traffic

FOLD_SCRIPT = r"""
import dataclasses, hashlib, json, sys
import orjson
from streams.core import native
from streams.core.join import RequestJoin
from streams.settings import Settings
from schemas.dead_letter import DeadLetter
from schemas.decode import decode_stage_event

messages = orjson.loads(open(sys.argv[1], "rb").read())
settings = Settings()
config = settings.join.model_copy(update=json.loads(sys.argv[2]))
window_ms = settings.windows.window_s * 1000
digest = hashlib.sha256()
changelog = {}  # state key -> (partition, packed): what the adapter's compacted topic would hold
core = RequestJoin(config, window_ms)
now = 1_700_000_000_000.0


def take(outputs):
    for out in outputs:
        digest.update(orjson.dumps(out, option=orjson.OPT_SORT_KEYS, default=repr))


def flush():
    for key, (partition, packed) in sorted(core.dirty().items()):
        digest.update(key.encode() + bytes([partition]) + (packed or b"-"))
        if packed is None:
            changelog.pop(key, None)
        else:
            changelog[key] = (partition, packed)


for i, (key, value) in enumerate(messages):
    event = decode_stage_event(value.encode(), key and key.encode(), "t", i % 2, i, None, settings.caps, now)
    if isinstance(event, DeadLetter):
        digest.update(event.model_dump_json().encode())
        continue
    take(core.add(event, i % 2, now, offset=i))
    if i % 500 == 499:
        take(core.advance(0, now, False))
        take(core.advance(1, now, False))
        flush()
    if i % 7000 == 6999:  # a restart: a fresh core rebuilt from the changelog alone
        flush()
        counters = core.counters
        core = RequestJoin(config, window_ms)
        core.counters = counters
        for key_s, (partition, packed) in changelog.items():
            core.restore(key_s, packed, partition)
now += 10 * 60_000
take(core.advance(0, now, True))
take(core.advance(1, now, True))
flush()
digest.update(repr(dataclasses.asdict(core.counters)).encode())
print(json.dumps({"status": native.STATUS, "digest": digest.hexdigest()}))
"""


def _fold(tmp_path: Path, messages_file: Path, caps: dict[str, int], native_on: bool) -> dict[str, str]:
    env = {**os.environ, "TTFT_NATIVE": "1" if native_on else "0"}
    proc = subprocess.run(
        [sys.executable, "-c", FOLD_SCRIPT, str(messages_file), json.dumps(caps)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_the_suite_runs_the_compiled_core() -> None:
    """``make setup`` built the core and this process imported it (else every figure is of the source)."""
    if os.environ.get("TTFT_NATIVE", "1") == "0":
        assert native.STATUS == "python (TTFT_NATIVE=0)"
        return
    assert native.STATUS == "native", native.STATUS
    assert join_module.__file__ is not None and join_module.__file__.endswith(".so")


@pytest.mark.parametrize("caps", [{}, {"max_open_requests": 60, "max_open_requests_per_tenant": 25}])
def test_compiled_and_source_fold_alike(tmp_path: Path, caps: dict[str, int]) -> None:
    traffic = build_traffic(3_000, seed=13, start_ms=1_700_000_000_000.0 - 3_600_000)
    messages_file = tmp_path / "messages.json"
    messages_file.write_bytes(
        orjson.dumps(
            [(k.decode() if k is not None else None, v.decode("utf-8", "replace")) for k, v in traffic.messages]
        )
    )
    source = _fold(tmp_path, messages_file, caps, native_on=False)
    compiled = _fold(tmp_path, messages_file, caps, native_on=True)
    assert source["status"] == "python (TTFT_NATIVE=0)"
    assert compiled["status"] == "native", native.check_manifest()
    assert source["digest"] == compiled["digest"]


def test_a_stale_or_failed_build_is_not_used(tmp_path: Path) -> None:
    for rel in native.NATIVE_SOURCES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    manifest = tmp_path / "manifest.json"
    assert native.check_manifest(manifest, tmp_path) == "not built: run make setup"
    current = {"built": True, "cache_tag": sys.implementation.cache_tag, "sources": native.source_digests(tmp_path)}
    manifest.write_text(json.dumps(current))
    assert native.check_manifest(manifest, tmp_path) is None
    (tmp_path / native.NATIVE_SOURCES[0]).write_text("x = 2\n")
    assert "stale" in (native.check_manifest(manifest, tmp_path) or "")
    manifest.write_text(json.dumps({**current, "cache_tag": "cpython-99"}))
    assert "cpython-99" in (native.check_manifest(manifest, tmp_path) or "")
    manifest.write_text(json.dumps({"built": False, "error": "gcc: not found"}))
    assert "gcc: not found" in (native.check_manifest(manifest, tmp_path) or "")
