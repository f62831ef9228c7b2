"""Capture the spans of a LangGraph agent (``langgraph.prebuilt.create_react_agent`` on ``langchain-openai``'s
``ChatOpenAI``, pointed at capture_tools.py's loopback stub, which answers a request offering tools with a tool call)
that the caller streams with ``agent.stream(..., stream_mode="messages")`` (LangGraph then makes the model stream);
write ``<set-up>.otlp`` and ``<set-up>.json`` (capture.py's ``write_capture``) into ``--out``.

Set-ups, each in its own process (capture_langchain.py's instrumentation):

- ``langgraph_openinference``: OpenInference's LangChain and OpenAI instrumentors;
- ``langgraph_openinference_helper``: both, and ttft-emit's helper on ``llm.root_client`` (from ``emitter/src``);
- ``langgraph_openllmetry_helper``: OpenLLMetry's LangChain instrumentation and the helper.

Cases, each a trace under a root span ``POST /ask`` after a 50 ms retrieval span and capture.PROMPT_WORK_S of prompt
work: ``tool_stream`` (the agent calls ``lookup_capital`` once, then answers) and ``plain_stream`` (an agent with no
tools). ``first_chunk_ns`` is when the caller gets the first ``AIMessageChunk`` with text (the answering turn's);
``first_any_chunk_ns`` the first chunk of any kind (turn 1's tool call); LangChain callbacks mark the model and tool
starts and ends. One warm-up request per case, not written.

    python3.11 -m venv /tmp/lg && /tmp/lg/bin/pip install -r tests/data/otel_instrumentations/requirements-langgraph.txt
    /tmp/lg/bin/python tests/data/otel_instrumentations/capture_langgraph.py --out /tmp/lg_out
"""

from __future__ import annotations

import json
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = OUT = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import capture  # noqa: E402
import capture_langchain  # noqa: E402
import capture_tools  # noqa: E402  (the stub that answers a tool call)

EMITTER_SRC = HERE.parents[2] / "emitter" / "src"
CASES = ("tool_stream", "plain_stream")
KEYS = (
    "first",
    "token",
    "stream",
    "operation",
    "span.kind",
    "model",
    "llm.system",
    "request.type",
    "invocation",
    "finish",
    "stop_reason",
    "tool",
    "time_to",
    "langgraph",
    "entity",
)
SETUPS: dict[str, tuple[str, bool]] = {
    "langgraph_openinference": ("openinference", False),
    "langgraph_openinference_helper": ("openinference", True),
    "langgraph_openllmetry_helper": ("openllmetry", True),
}
QUESTION = "What is the capital of France?"
REQUESTS: list[dict[str, Any]] = []  # what the stub was asked (stream flags), for the report


class RecordingHandler(capture_tools.ToolStubHandler):
    def do_POST(self) -> None:
        import io

        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = json.loads(raw or b"{}")
        REQUESTS.append(
            {
                "t_ns": time.time_ns(),
                "path": self.path,
                "stream": body.get("stream"),
                "stream_options": body.get("stream_options"),
                "tools": bool(body.get("tools")),
                "roles": [m.get("role") for m in body.get("messages") or [] if isinstance(m, dict)],
            }
        )
        self.rfile = io.BytesIO(raw)
        super().do_POST()


def serve() -> tuple[Any, str]:
    import threading
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), RecordingHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


class LangGraphService:
    def __init__(self, provider: Any, base_url: str, helper: bool, convention: str) -> None:
        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI
        from langgraph.prebuilt import create_react_agent

        self.convention = convention
        self.tracer = provider.get_tracer("rag-langgraph")
        llm = ChatOpenAI(base_url=base_url, api_key="stub-key", model=capture.MODEL, max_retries=0)
        if helper:  # the service's one line
            sys.path.insert(0, str(EMITTER_SRC))
            from ttft_emit.otel import time_first_chunk

            self.timing = time_first_chunk(llm.root_client, tracer_provider=provider)
        else:
            self.timing = None

        @tool
        def lookup_capital(country: str) -> str:
            """The capital city of a country."""
            assert country == "France", country
            time.sleep(capture_tools.TOOL_WORK_S)
            return capture_tools.TOOL_RESULT

        self.agents = {
            "tool_stream": create_react_agent(llm, [lookup_capital]),
            "plain_stream": create_react_agent(llm, []),
        }

    def call(self, case: str) -> dict[str, Any]:
        from langchain_core.callbacks import BaseCallbackHandler
        from langchain_core.messages import AIMessageChunk

        marks: dict[str, list[int]] = {"llm_start_ns": [], "llm_end_ns": [], "tool_start_ns": [], "tool_end_ns": []}

        class Marks(BaseCallbackHandler):
            def on_chat_model_start(self, *a: Any, **k: Any) -> None:
                marks["llm_start_ns"].append(time.time_ns())

            def on_llm_end(self, *a: Any, **k: Any) -> None:
                marks["llm_end_ns"].append(time.time_ns())

            def on_tool_start(self, *a: Any, **k: Any) -> None:
                marks["tool_start_ns"].append(time.time_ns())

            def on_tool_end(self, *a: Any, **k: Any) -> None:
                marks["tool_end_ns"].append(time.time_ns())

        first_chunk_ns = None
        first_any_chunk_ns = None
        text = ""
        kinds: list[str] = []
        called_ns = time.time_ns()
        for msg, _meta in self.agents[case].stream(
            {"messages": [("user", QUESTION)]}, stream_mode="messages", config={"callbacks": [Marks()]}
        ):
            now = time.time_ns()
            kinds.append(type(msg).__name__)
            if isinstance(msg, AIMessageChunk):
                if first_any_chunk_ns is None:
                    first_any_chunk_ns = now
                if isinstance(msg.content, str) and msg.content:
                    if first_chunk_ns is None:
                        first_chunk_ns = now
                    text += msg.content
        answered_ns = time.time_ns()
        assert text == "".join(capture.CHUNKS), (text, kinds)
        return {
            "called_ns": called_ns,
            "first_chunk_ns": first_chunk_ns,
            "answered_ns": answered_ns,
            "first_any_chunk_ns": first_any_chunk_ns,
            **marks,
            "yielded": sorted(set(kinds)),
        }

    def ask(self, case: str) -> dict[str, Any]:
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            with capture.retrieval_span(self.tracer, self.convention, QUESTION):
                time.sleep(0.050)  # the vector search
            time.sleep(capture.PROMPT_WORK_S)
            seen = self.call(case)
        return {
            "case": case,
            "trace_id": format(root.get_span_context().trace_id, "032x"),
            "streaming": True,
            "retrieval_attempts": 1,
            **seen,
        }


def run_setup(setup: str, out: Path) -> None:
    from dataclasses import asdict

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    library, helper = SETUPS[setup]
    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-langgraph", "service.version": "3.0.0", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    capture_langchain.instrument(library, provider)
    server, base_url = serve()
    convention = "openinference" if library == "openinference" else "genai"
    service = LangGraphService(provider, base_url, helper, convention)
    for case in CASES:  # warm-up, not written
        service.call(case)
    warm = asdict(service.timing.stats) if service.timing is not None else None
    exporter.clear()
    REQUESTS.clear()
    truth = [service.ask(case) for case in CASES]
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    versions = capture_langchain.versions(library)
    for d in ("langgraph", "langgraph-prebuilt"):
        versions[d] = metadata.version(d)
    if helper:
        versions["ttft-emit"] = metadata.version("ttft-emit")
    capture.write_capture(out, setup, spans, truth, versions, KEYS, timing=service.timing, warm=warm)
    print("\n# stub requests:")
    for r in REQUESTS:
        print("  ", r)


def main() -> None:
    capture.setup_main(__file__, __doc__, SETUPS, run_setup, OUT, "", timeout_s=180)


if __name__ == "__main__":
    main()
