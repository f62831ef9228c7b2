"""Capture the spans of Java services: OpenTelemetry's own openai-java instrumentation, and Spring AI's own tracing.

Two Maven projects (their main classes say what the service does), against the OpenAI stub of :mod:`capture`
(started here, in this process), each set-up in a JVM of its own (``mvn exec:java``):

- ``java_openai/`` (``Capture.java``): the openai-java client wrapped by ``opentelemetry-openai-java-1.1``;
  set-ups ``otel``, ``otel_marked``; files ``java_openai_<set-up>``. ``agent``, ``agent_marked``: the same service
  under OpenTelemetry's Java agent (:data:`AGENT`, ``-javaagent``), which exports over OTLP/HTTP to a receiver
  here (:func:`write_received` regroups its exports per trace; the ``opentelemetry-proto`` package is needed:
  run this with the project's venv);
- ``java_spring_ai/`` (``SpringAiCapture.java``): a Spring AI 2.0 RAG service (ChatClient, QuestionAnswerAdvisor,
  SimpleVectorStore) under Spring Boot 4's OpenTelemetry starter; set-ups ``spring_ai``, ``spring_ai_marked``;
  files ``java_spring_ai_<set-up>``. ``java_spring_ai11/``: the same source on Spring AI 1.1 and Spring Boot 3.5
  (actuator's OpenTelemetry SDK, Micrometer Tracing's bridge); set-ups ``spring_ai11``, ``spring_ai11_marked``;
  files ``java_spring_ai11_<set-up>``. ``spring_ai_agent``: the Spring AI 2.0 service under the Java agent too
  (beside Boot's OpenTelemetry starter, which its documentation advises against): the agent's spans, received,
  join the service's own trace by trace (two exporters, as a Collector gets them). Every span is a trace of its
  own there (``ttft otel check``: "a trace that starts at a stage span"). ``spring_ai_noprop``:
  ``spring.reactor.context-propagation`` left at Boot's default.

``java_common/`` holds the file writer both compile in. ::

    python3 tests/data/otel_instrumentations/capture_java.py [--setup SETUP ...] [--out DIR] [--isolated]

Needs Java 17 and Maven (the first run resolves the pinned artifacts of ``java_openai/pom.xml``). With
``--isolated`` this script runs again, stub and JVM together, in a network namespace whose only interface is the
loopback, Maven offline: run once without it first, so everything is resolved.
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from capture import ISOLATED, StubHandler

HERE = Path(__file__).resolve().parent
#: set-up -> the Maven project that runs it.
SETUPS = {
    "otel": "java_openai",
    "otel_marked": "java_openai",
    "agent": "java_openai",
    "agent_marked": "java_openai",
    "spring_ai": "java_spring_ai",
    "spring_ai_marked": "java_spring_ai",
    "spring_ai11": "java_spring_ai11",
    "spring_ai11_marked": "java_spring_ai11",
    "spring_ai_agent": "java_spring_ai",
    "spring_ai_noprop": "java_spring_ai",
}
#: Maven project -> its main class, and the system properties its pom's exec configuration sets (the agent set-ups
#: run ``java`` directly).
MAINS = {
    "java_openai": ("ttft.Capture", {"ttft.openai.version": "4.105.0"}),
    "java_spring_ai": (
        "ttft.SpringAiCapture",
        {"ttft.versions": "spring-boot 4.0.7, spring-ai 2.0.1, opentelemetry-javaagent {agent}"},
    ),
}
#: OpenTelemetry's Java agent of the ``agent`` set-ups (its openai-java instrumentation is the library's).
AGENT = "io.opentelemetry.javaagent:opentelemetry-javaagent:2.31.1"


class ClosingStubHandler(StubHandler):
    """:class:`capture.StubHandler` saying ``Connection: close``: OkHttp otherwise sends the next request on the
    connection an HTTP/1.0 answer ended ("unexpected end of stream")."""

    def end_headers(self) -> None:
        self.send_header("Connection", "close")
        super().end_headers()


def serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ClosingStubHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


class TraceReceiver(BaseHTTPRequestHandler):
    """``POST /v1/traces`` (OTLP/HTTP, protobuf): each body kept, in arrival order (``server.bodies``)."""

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.bodies.append(body)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()


def write_received(bodies: list[bytes], out: Path, name: str, merge: bool = False) -> None:
    """The agent's exports regrouped as the other captures are: one ``ExportTraceServiceRequest`` per trace (each
    span under its own resource and scope), the requests' traces in the json's order, then the others (listed
    under ``other_traces`` there). ``merge``: the service wrote its own spans to ``name.otlp`` (another exporter):
    the agent's join them, trace by trace (the agent's traces of the service's warm-up among the others)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans: dict[str, list[tuple[Any, Any, Any]]] = {}

    def take(body: bytes) -> None:
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    spans.setdefault(span.trace_id.hex(), []).append((rs, ss, span))

    if merge:
        raw, at = (out / f"{name}.otlp").read_bytes(), 0
        while at < len(raw):
            (size,) = struct.unpack_from(">I", raw, at)
            take(raw[at + 4 : at + 4 + size])
            at += 4 + size
    for body in bodies:
        take(body)
    doc = json.loads((out / f"{name}.json").read_text())
    ids = [t["trace_id"] for t in doc["traces"]]
    doc["other_traces"] = [t for t in spans if t not in ids]
    with (out / f"{name}.otlp").open("wb") as f:
        for trace_id in ids + doc["other_traces"]:
            message = ExportTraceServiceRequest()
            for rs, ss, span in spans.get(trace_id, []):
                added = message.resource_spans.add(resource=rs.resource, schema_url=rs.schema_url)
                added.scope_spans.add(scope=ss.scope, schema_url=ss.schema_url).spans.append(span)
            raw = message.SerializeToString()
            f.write(struct.pack(">I", len(raw)) + raw)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    for trace_id in ids + doc["other_traces"]:
        for _, ss, span in spans.get(trace_id, []):
            took = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6
            print(f"{trace_id[:8]} {span.name:40s} {took:8.1f} ms {ss.scope.name}")


def run_agent(setup: str, base_url: str, out: Path, offline: bool) -> None:
    """An agent set-up: the classpath and the agent from Maven, the JVM with ``-javaagent`` exporting to a receiver
    here, then the capture's files from what it received."""
    pom, target = HERE / SETUPS[setup] / "pom.xml", HERE / SETUPS[setup] / "target"
    mvn = ["mvn", "-q", "-B", *(["-o"] if offline else []), "-f", str(pom)]
    subprocess.run(
        [*mvn, "compile", "dependency:build-classpath", f"-Dmdep.outputFile={target / 'cp.txt'}"], check=True
    )
    subprocess.run(
        [*mvn, "dependency:copy", f"-Dartifact={AGENT}", f"-DoutputDirectory={target / 'agent'}"], check=True
    )
    version = AGENT.rsplit(":", 1)[1]
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), TraceReceiver)
    receiver.bodies = []  # type: ignore[attr-defined]
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        classpath = f"{target / 'classes'}:{(target / 'cp.txt').read_text().strip()}"
        properties = {
            "otel.service.name": "rag-api-java",
            "otel.resource.attributes": "tenant.id=acme",
            "otel.traces.exporter": "otlp",
            "otel.exporter.otlp.protocol": "http/protobuf",
            "otel.exporter.otlp.traces.endpoint": f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces",
            "otel.metrics.exporter": "none",
            "otel.logs.exporter": "none",
            "otel.bsp.schedule.delay": "100",
            "ttft.agent.version": version,
            **{k: v.format(agent=version) for k, v in MAINS[SETUPS[setup]][1].items()},
        }
        cmd = [
            "java",
            f"-javaagent:{target / 'agent' / f'opentelemetry-javaagent-{version}.jar'}",
            *(f"-D{k}={v}" for k, v in properties.items()),
            "-cp",
            classpath,
            MAINS[SETUPS[setup]][0],
            *("--base-url", base_url, "--out", str(out), "--setup", setup),
        ]
        subprocess.run(cmd, check=True, timeout=300)
        spring = SETUPS[setup] == "java_spring_ai"  # the service exports its own spans to its file too
        write_received(receiver.bodies, out, f"{SETUPS[setup]}_{setup}", merge=spring)  # type: ignore[attr-defined]
    finally:
        receiver.shutdown()


def run_setup(setup: str, out: Path, offline: bool) -> None:
    server, base_url = serve()
    if "agent" in setup:
        try:
            run_agent(setup, base_url, out, offline)
        finally:
            server.shutdown()
        print(f"{setup}: {out / f'{SETUPS[setup]}_{setup}.otlp'}")
        return
    try:
        args = f"--base-url {base_url} --out {out} --setup {setup}"
        pom = HERE / SETUPS[setup] / "pom.xml"
        cmd = ["mvn", "-q", "-B", "-f", str(pom), "compile", "exec:java", f"-Dexec.args={args}"]
        if offline:
            cmd.insert(1, "-o")
        subprocess.run(cmd, check=True, timeout=300)
    finally:
        server.shutdown()
    print(f"{setup}: {out / f'{SETUPS[setup]}_{setup}.otlp'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setup", choices=list(SETUPS), action="append", help="default: every set-up")
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--isolated", action="store_true", help="the JVM sees no network but the loopback")
    p.add_argument("--offline", action="store_true", help=argparse.SUPPRESS)  # what --isolated re-runs with
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.isolated:  # this script again, stub and JVM together, in a namespace with the loopback only
        again = [sys.executable, __file__, "--out", str(args.out.resolve()), "--offline"]
        for setup in args.setup or ():
            again += ["--setup", setup]
        subprocess.run([*ISOLATED, *again], check=True, timeout=900)
        return
    for setup in args.setup or SETUPS:
        run_setup(setup, args.out.resolve(), args.offline)


if __name__ == "__main__":
    main()
