from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import orjson
import pytest
from aiokafka.errors import KafkaTimeoutError
from emit_fakes import ProducerScript, decoded

from ttft_emit import ThreadedStageEmitter

TESTS_DIR = Path(__file__).resolve().parent


def _run_threads(count: int, target: object) -> None:
    threads = [threading.Thread(target=target, args=(t,)) for t in range(count)]  # type: ignore[arg-type]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.mark.net
def test_request_threads_never_wait_for_an_absent_broker_and_drops_are_exact(closed_port: int) -> None:
    emitter = ThreadedStageEmitter(f"127.0.0.1:{closed_port}", tenant_id="acme", max_buffer=100, stop_timeout_s=0.5)
    t0 = time.perf_counter()
    emitter.start()
    assert time.perf_counter() - t0 < 0.5  # a thread start, not a connection
    timings: list[float] = []
    lock = threading.Lock()

    def serve(t: int) -> None:
        mine = []
        for i in range(300):
            start = time.perf_counter()
            req = emitter.request(f"t{t}-r{i}")
            req.request_start()
            with req.stage("retrieval"):
                pass
            req.first_token()
            mine.append((time.perf_counter() - start) / 4)  # four calls, three events
        with lock:
            timings.extend(mine)

    _run_threads(8, serve)
    stats = emitter.stats
    assert not stats.connected and stats.sent == 0
    assert stats.queued + stats.dropped == 8 * 300 * 3 and stats.queued <= 100
    timings.sort()
    # No network wait on the request path; loose bounds for a shared, loaded machine with 8 threads on its GIL.
    assert timings[len(timings) // 2] < 0.001
    t0 = time.perf_counter()
    emitter.stop()
    assert time.perf_counter() - t0 < 3.0
    stats = emitter.stats
    assert (stats.queued, stats.sent, stats.dropped) == (0, 0, 8 * 300 * 3)


def test_events_from_many_threads_are_all_sent_once_and_stop_flushes() -> None:
    script = ProducerScript(1, [KafkaTimeoutError()] * 3)
    emitter = ThreadedStageEmitter(
        "127.0.0.1:1",
        tenant_id="acme",
        version_id="v7",
        retry_backoff_s=(0.001, 0.01),
        flush_interval_s=0.001,
        producer_factory=script.factory,
    )
    with emitter:

        def serve(t: int) -> None:
            for i in range(250):
                req = emitter.request(f"t{t}-r{i}")
                req.request_start()
                with req.stage("llm_ttft", attrs={"prompt_tokens": i}):
                    pass

        _run_threads(8, serve)
    stats = emitter.stats
    assert (stats.sent, stats.dropped, stats.invalid, stats.queued) == (4_000, 0, 0, 0)
    events = script.sent_events()
    assert len(events) == 4_000
    assert len({e["event_id"] for e in events}) == 4_000
    assert {e["version_id"] for e in events} == {"v7"}
    assert all(p.stopped for p in script.producers)


def test_start_and_stop_are_idempotent_and_events_outside_them_are_counted() -> None:
    script = ProducerScript()
    emitter = ThreadedStageEmitter("127.0.0.1:1", tenant_id="acme", producer_factory=script.factory)
    emitter.request("early").request_start()
    emitter.start()
    emitter.start()
    emitter.request("r").request_start(attrs={"bad": object()})  # not JSON: invalid, never raised
    emitter.request("r").first_token()
    emitter.stop()
    emitter.stop()
    emitter.request("late").first_token()
    stats = emitter.stats
    assert (stats.sent, stats.dropped, stats.invalid, stats.queued) == (1, 2, 1, 0)
    assert [e["request_id"] for e in script.sent_events()] == ["r"]


def test_a_sender_that_cannot_create_its_producer_never_reaches_the_request_path() -> None:
    def broken_factory(**_: object) -> object:
        raise TypeError("unexpected keyword argument 'sasl_mechanizm'")

    emitter = ThreadedStageEmitter(
        "127.0.0.1:1", tenant_id="acme", max_buffer=5, retry_backoff_s=(0.001, 0.01), producer_factory=broken_factory
    )
    emitter.start()
    for i in range(20):
        emitter.request(f"r{i}").request_start()
    assert [e["request_id"] for e in decoded(emitter.buffered())] == [f"r{i}" for i in range(15, 20)]
    emitter.stop()
    stats = emitter.stats
    assert (stats.sent, stats.dropped, stats.queued) == (0, 20, 0)


def _run_script(body: str) -> subprocess.CompletedProcess[str]:
    code = f"import sys; sys.path.insert(0, {str(TESTS_DIR)!r})\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_forked_child_gets_its_own_buffer_counters_and_sender() -> None:
    result = _run_script(
        """
        import os, orjson
        from emit_fakes import ProducerScript
        from ttft_emit import ThreadedStageEmitter

        script = ProducerScript()
        emitter = ThreadedStageEmitter("x:1", tenant_id="acme", flush_interval_s=0.001, producer_factory=script.factory)
        emitter.start()
        emitter.request("parent-1").request_start()
        emitter._lifecycle.acquire()  # held at the fork, as by a thread starting or stopping the emitter
        pid = os.fork()
        if pid == 0:
            emitter.request("child-1").request_start()
            emitter.stop()  # would hang on the inherited lock
            s = emitter.stats
            ids = sorted(e["request_id"] for e in script.sent_events())
            print(orjson.dumps({"sent": s.sent, "dropped": s.dropped, "ids": ids}).decode(), flush=True)
            os._exit(0)
        emitter._lifecycle.release()
        os.waitpid(pid, 0)
        emitter.stop()
        print(orjson.dumps({"parent_sent": emitter.stats.sent}).decode(), flush=True)
        """
    )
    assert result.returncode == 0, result.stderr
    child, parent = (orjson.loads(line) for line in result.stdout.splitlines())
    # The child sent its own event only (the parent's may or may not have gone before the fork: not its own).
    assert child["sent"] == 1 and child["dropped"] == 0 and "child-1" in child["ids"]
    assert parent == {"parent_sent": 1}


def test_what_is_buffered_is_sent_at_interpreter_exit() -> None:
    result = _run_script(
        """
        import atexit
        atexit.register(lambda: print(len(script.sent), flush=True))  # registered first, so it runs last
        from emit_fakes import ProducerScript
        from ttft_emit import ThreadedStageEmitter

        script = ProducerScript(start_delay_s=0.3)  # still connecting when the script ends
        emitter = ThreadedStageEmitter("x:1", tenant_id="acme", producer_factory=script.factory)
        emitter.start()
        for i in range(50):
            emitter.request(f"r{i}").request_start()
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "50"
