"""Capture the spans of Java services: OpenTelemetry's own openai-java instrumentation, and Spring AI's own tracing.

Two Maven projects (their main classes say what the service does), against the OpenAI stub of :mod:`capture`
(started here, in this process), each set-up in a JVM of its own (``mvn exec:java``):

- ``java_openai/`` (``Capture.java``): the openai-java client wrapped by ``opentelemetry-openai-java-1.1``;
  set-ups ``otel``, ``otel_marked``; files ``java_openai_<set-up>``;
- ``java_spring_ai/`` (``SpringAiCapture.java``): a Spring AI 2.0 RAG service (ChatClient, QuestionAnswerAdvisor,
  SimpleVectorStore) under Spring Boot 4's OpenTelemetry starter; set-ups ``spring_ai``, ``spring_ai_marked``;
  files ``java_spring_ai_<set-up>``.

``java_common/`` holds the file writer both compile in. ::

    python3 tests/data/otel_instrumentations/capture_java.py [--setup SETUP ...] [--out DIR] [--isolated]

Needs Java 17 and Maven (the first run resolves the pinned artifacts of ``java_openai/pom.xml``). With
``--isolated`` this script runs again, stub and JVM together, in a network namespace whose only interface is the
loopback, Maven offline: run once without it first, so everything is resolved.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from capture import ISOLATED, StubHandler

HERE = Path(__file__).resolve().parent
#: set-up -> the Maven project that runs it.
SETUPS = {
    "otel": "java_openai",
    "otel_marked": "java_openai",
    "spring_ai": "java_spring_ai",
    "spring_ai_marked": "java_spring_ai",
}


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


def run_setup(setup: str, out: Path, offline: bool) -> None:
    server, base_url = serve()
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
