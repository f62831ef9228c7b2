"""Scale-out of the join alone (no writer): 1 vs 2 join workers on 8 partitions, with CPU accounting.

The traffic is pre-produced once on this phase's prefix; each configuration is a fresh consumer group
(its own app id, so its own changelog) over the same topic. A configuration is timed from the moment
every worker is up and the partitions are split between them until the group has committed every
event; the events it processed in that window are the total minus what was committed when it opened.
CPU seconds of each join worker and of the broker JVM, and the whole machine's busy share, are taken
over the same window: on 2 cores they say whether a second worker had a core to run on. The two
configurations alternate over several rounds, and the median run of each is reported.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

from bench.harness import BenchEnv, Offsets, free_port, produce
from bench.procstat import cores_used, machine_busy_share, read_machine, read_proc
from bench.traffic import EVENTS_PER_REQUEST, Traffic, first_requests
from tests.support.pipeline import WorkerProcess


def measure_scaleout(
    env: BenchEnv, traffic: Traffic, events: int, timeout_s: float = 300.0, rounds: int = 3
) -> dict[str, Any]:
    """Events/s and CPU of 1 and of 2 join workers over the same pre-produced events (about ``events``).

    The configurations alternate for ``rounds`` rounds (1, 2, 1, 2, ...), each a fresh consumer group.
    Per configuration the run with the median join CPU per event is reported (its figures together), and
    every run is in the details: on a shared 2-core machine one run moves by a third from noise alone.
    """
    settings = env.settings("scale")
    env.create_topics(settings)
    messages = first_requests(traffic, max(1, int(events / EVENTS_PER_REQUEST)))
    produce(settings, settings.topic("stage-events"), messages)
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    for round_no in range(rounds):
        for n in (1, 2):
            result = _run(env, n, len(messages), timeout_s, f"r{round_no}")
            cores, eps = result["join_cores"], result["events_per_s"]
            result["join_cpu_us_per_event"] = cores / eps * 1e6 if cores and eps else None
            runs[n].append(result)
    figures: dict[str, float | None] = {}
    details: dict[str, Any] = {"rounds": rounds}
    for n, results in runs.items():
        measured = [r for r in results if r["join_cpu_us_per_event"] is not None]
        chosen = sorted(measured, key=lambda r: r["join_cpu_us_per_event"])[len(measured) // 2]
        key = f"scale_{n}w"
        figures[f"{key}_events_per_s"] = chosen["events_per_s"]
        figures[f"{key}_join_cores"] = chosen["join_cores"]
        figures[f"{key}_broker_cores"] = chosen["broker_cores"]
        figures[f"{key}_machine_busy"] = chosen["machine_busy"]
        details[key] = chosen
        details[f"{key}_runs"] = results
    return {"figures": figures, "details": details}


def _run(env: BenchEnv, workers: int, total: int, timeout_s: float, tag: str) -> dict[str, Any]:
    base = env.settings("scale")
    app_id = f"{base.app_id}-{workers}w-{tag}"
    pipe = env.pipeline(base, TTFT_APP_ID=app_id)
    group = f"{app_id}-join"
    topic = base.topic("stage-events")
    started = [pipe.start("join", free_port()) for _ in range(workers)]
    try:
        for w in started:
            pipe.wait_healthy(w, timeout=120)
        _wait_split(started, base.partitions, timeout_s=60)
        broker_pid = env.broker.pid
        return asyncio.run(_window(env, started, broker_pid, group, topic, total, timeout_s))
    finally:
        for w in started:
            pipe.stop(w)


def _assigned(worker: WorkerProcess) -> list[int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/healthz", timeout=2) as resp:
        body = json.loads(resp.read())
    return list(body.get("partitions", [])) if body.get("status") == "ok" else []


def _wait_split(workers: list[WorkerProcess], partitions: int, timeout_s: float) -> None:
    """Until every partition is owned by exactly one of ``workers``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        owned = [p for w in workers for p in _assigned(w)]
        if sorted(owned) == list(range(partitions)):
            return
        time.sleep(0.1)
    raise TimeoutError(f"partitions not split between {len(workers)} workers in {timeout_s:.0f} s")


async def _window(
    env: BenchEnv,
    workers: list[WorkerProcess],
    broker_pid: int | None,
    group: str,
    topic: str,
    total: int,
    timeout_s: float,
) -> dict[str, Any]:
    async with Offsets(env.bootstrap) as offsets:
        t0 = time.time()
        done0 = sum((await offsets.committed(group)).values())
        procs0 = [read_proc(w.proc.pid) for w in workers]
        broker0 = read_proc(broker_pid) if broker_pid else None
        machine0 = read_machine()
        deadline = time.monotonic() + timeout_s
        while await offsets.lag(group, [topic]) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(workers)} join workers did not drain in {timeout_s:.0f} s")
            await asyncio.sleep(0.1)
        t1 = time.time()
        procs1 = [read_proc(w.proc.pid) for w in workers]
        broker1 = read_proc(broker_pid) if broker_pid else None
        machine1 = read_machine()
    wall = t1 - t0
    per_worker = [cores_used(a, b, wall) for a, b in zip(procs0, procs1, strict=True)]
    return {
        "events_per_s": (total - done0) / wall if wall > 0 else None,
        "events_in_window": total - done0,
        "seconds": wall,
        "join_cores": sum(per_worker),
        "join_cores_per_worker": per_worker,
        "broker_cores": cores_used(broker0, broker1, wall) if broker0 and broker1 else None,
        "machine_busy": machine_busy_share(machine0, machine1),
    }
