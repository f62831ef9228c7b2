"""A synchronous WSGI service instrumented with ``ttft_emit.ThreadedStageEmitter`` (and nothing else of ours).

    python tests/support/wsgi_emitting_service.py --bootstrap HOST:PORT --topic T --tenant acme

Serves on a free loopback port (printed as the first stdout line, ``port N``) with a thread per request
(``wsgiref`` + ``socketserver.ThreadingMixIn``, the standard library's threaded WSGI server):

- ``GET /ask?id=R``: one request of a RAG service: ``request_start``, ``retrieval``, ``prompt_assemble``,
  ``llm_ttft``, ``first_token`` (five events from eleven emitter calls), each stage a short sleep.
- ``GET /stats``: JSON of what was served and emitted so far, the emitter's counters, the timings.
- ``POST /stop``: stops the emitter (it sends what it holds within ``--stop-timeout``), answers the final
  JSON, then the server exits.

Every emitter call is timed three ways, so that the time a request spent in it splits into
``wall = cpu + runnable + blocked``:

- ``cpu``: the request thread's own CPU time (``time.thread_time``): the emitter's work;
- ``runnable``: time the thread was ready to run but the kernel ran something else (Linux
  ``/proc/self/task/<tid>/schedstat``, run-queue delay): a loaded machine, not the emitter;
- ``blocked``: the rest, time the thread slept: waiting for a lock, for I/O or for the GIL (whichever
  thread held it). This is "blocked by emitting", counted conservatively: a GIL wait behind another
  request thread counts against the emitter too.

Used by tests/integration/test_emit_wsgi_load.py with the real broker stopped for part of the run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ttft_emit import ThreadedStageEmitter

STAGES = ("retrieval", "prompt_assemble", "llm_ttft")
EVENTS_PER_REQUEST = 2 + len(STAGES)


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 128


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def run_delay_s() -> float:
    """Seconds this thread has waited on a run queue, runnable but not running (Linux schedstat)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat", "rb") as stat:
        return int(stat.read().split()[1]) / 1e9


class CallClock:
    """Times calls into the emitter; one per request (a request runs on one thread)."""

    def __init__(self) -> None:
        self.wall = self.cpu = self.runnable = self.blocked = self.max_call = 0.0

    def call(self, target: Callable[..., Any], *args: Any) -> Any:
        delay0 = run_delay_s()
        cpu0 = time.thread_time()
        start = time.perf_counter()
        result = target(*args)
        wall = time.perf_counter() - start
        cpu = time.thread_time() - cpu0
        runnable = min(run_delay_s() - delay0, max(wall - cpu, 0.0))
        self.wall += wall
        self.cpu += cpu
        self.runnable += runnable
        self.blocked += max(wall - cpu - runnable, 0.0)
        self.max_call = max(self.max_call, wall)
        return result


class Timings:
    """Per request: seconds spent inside emitter calls, split by :class:`CallClock`; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: list[CallClock] = []
        self.emitted = 0

    def add(self, clock: CallClock, emitted: int) -> None:
        with self._lock:
            self.requests.append(clock)
            self.emitted += emitted

    def summary(self) -> dict[str, Any]:
        with self._lock:
            requests = list(self.requests)
            emitted = self.emitted

        def quantiles(values: list[float]) -> dict[str, float]:
            values = sorted(values)
            if not values:
                return {}

            def at(q: float) -> float:
                return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 4)

            return {"p50": at(0.5), "p99": at(0.99), "p999": at(0.999), "max": at(1.0)}

        return {
            "requests": len(requests),
            "emitted": emitted,
            "wall_ms": quantiles([r.wall for r in requests]),
            "cpu_ms": quantiles([r.cpu for r in requests]),
            "runnable_ms": quantiles([r.runnable for r in requests]),
            "blocked_ms": quantiles([r.blocked for r in requests]),
            "max_call_ms": round(max((r.max_call for r in requests), default=0.0) * 1000, 4),
            "wall_over_1ms": sum(1 for r in requests if r.wall > 0.001),
        }


def make_app(
    emitter: ThreadedStageEmitter, timings: Timings, stage_s: float, stop: Callable[[], None]
) -> Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]:
    served = itertools.count(1)

    def ask(request_id: str) -> None:
        clock = CallClock()
        req = clock.call(emitter.request, request_id)
        clock.call(req.request_start)
        for stage in STAGES:
            span = clock.call(req.stage, stage)
            clock.call(span.__enter__)
            time.sleep(stage_s)  # the stage's own work: I/O, in a real service
            clock.call(span.__exit__, None, None, None)
        clock.call(req.first_token)
        timings.add(clock, EVENTS_PER_REQUEST)

    def report() -> dict[str, Any]:
        stats = emitter.stats
        return {
            **timings.summary(),
            "stats": {
                "queued": stats.queued,
                "sent": stats.sent,
                "dropped": stats.dropped,
                "invalid": stats.invalid,
                "connected": stats.connected,
            },
        }

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/ask":
            query = parse_qs(environ.get("QUERY_STRING", ""))
            ask(query.get("id", [f"r{next(served)}"])[0])
            body = b"ok"
        elif path == "/stats":
            body = json.dumps(report()).encode()
        elif path == "/stop" and environ.get("REQUEST_METHOD") == "POST":
            emitter.stop()
            body = json.dumps(report()).encode()
            stop()
        else:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found"]
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--tenant", default="acme")
    parser.add_argument("--max-buffer", type=int, default=10_000)
    parser.add_argument("--stage-ms", type=float, default=1.0)
    parser.add_argument("--stop-timeout", type=float, default=30.0)
    args = parser.parse_args()
    if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"):
        sys.exit("needs Linux schedstat (/proc/self/task/<tid>/schedstat) to split the time spent in calls")

    emitter = ThreadedStageEmitter(
        args.bootstrap,
        args.topic,
        tenant_id=args.tenant,
        version_id="v1",
        route="main",
        max_buffer=args.max_buffer,
        stop_timeout_s=args.stop_timeout,
    )
    emitter.start()
    timings = Timings()
    holder: dict[str, WSGIServer] = {}

    def stop() -> None:
        threading.Thread(target=holder["server"].shutdown, daemon=True).start()

    app = make_app(emitter, timings, args.stage_ms / 1000.0, stop)
    server = make_server("127.0.0.1", 0, app, server_class=ThreadingWSGIServer, handler_class=QuietHandler)
    holder["server"] = server
    print(f"port {server.server_port}", flush=True)
    server.serve_forever(poll_interval=0.1)
    server.server_close()


if __name__ == "__main__":
    main()
