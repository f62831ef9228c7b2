"""Capture the spans OpenLIT (``openlit.init``) exports for the Anthropic, Google Gen AI and AWS Bedrock clients
against the loopback stubs of capture_anthropic.py, capture_google_genai.py and capture_bedrock.py (their
stub classes, services and truth recording are imported, not copied); write ``openlit_<provider>.otlp``
(4-byte big-endian length + one ExportTraceServiceRequest per trace, ``capture.write_traces``) and
``openlit_<provider>.json`` (what the client saw) beside this file, then print a span table.

OpenLIT is set up as in capture_openlit.py: our SDK TracerProvider is set globally first (openlit 1.45's
``init`` takes no tracer and reuses the global one), metrics and events are disabled, and pricing comes from
a local empty file (otherwise ``init`` fetches its pricing file from the network). Everything else is
openlit's default, including its httpx / requests / urllib3 instrumentors. The resource has
``tenant.id = acme``.

Providers, one process each (``--provider``), three requests each, every request a trace with a root span
``POST /ask`` (SERVER), a retrieval span ``gen_ai.operation.name = retrieval`` around 50 ms of vector search,
:data:`capture.PROMPT_WORK_S` of prompt work, then the call:

- ``anthropic``: ``anthropic.Anthropic(base_url=stub)``: ``stream`` (``messages.create(stream=True)``),
  ``stream_helper`` (``with messages.stream(...) as s: for text in s.text_stream``), ``non_stream``.
  anthropic 2.x's own tracing (scope ``com.anthropic.sdk.python``) is on whenever a global tracer provider is
  set, and OpenLIT needs one: its spans are exported beside OpenLIT's;
- ``anthropic_nosdk``: the same with ``anthropic.Anthropic(..., open_telemetry=False)``: OpenLIT's alone;
- ``google_genai``: ``genai.Client`` (``http_options.base_url`` = stub): ``stream``
  (``models.generate_content_stream``), ``non_stream`` (``models.generate_content``), ``stream_async``
  (``await aio.models.generate_content_stream`` iterated with ``async for``); the client is warmed up first
  as in capture_google_genai.py (those calls are traces of their own, not written);
- ``bedrock``: ``boto3.client("bedrock-runtime", endpoint_url=stub)`` made after ``openlit.init`` (OpenLIT
  wraps ``ClientCreator.create_client``), fake credentials in the environment: ``converse_stream``
  (``response["stream"]`` iterated), ``converse``, ``invoke_stream``
  (``invoke_model_with_response_stream``, Anthropic body).

The json records per trace the case, trace id, streaming or not, the client's wall time (ns) just before the
call, at the first output text it got (streaming) and when the call was done; and the versions.

openlit 1.45.0 declares ``anthropic<1.0.0``: pip resolves it with anthropic 0.125.0, which has no tracing of
its own. anthropic 2.17.0 (the version of capture_anthropic.py, with its ``httpx2``) is installed over it
(pip warns of the conflict; OpenLIT's ``AnthropicInstrumentor`` itself asks for ``anthropic >= 0.21.0``), so
requirements-openlit-providers.txt is a full freeze installed without the resolver:

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/olp
    /tmp/olp/bin/pip install --no-deps -r tests/data/otel_instrumentations/requirements-openlit-providers.txt
    /tmp/olp/bin/python tests/data/otel_instrumentations/capture_openlit_providers.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # write_traces, the timing constants
import capture_anthropic  # AnthropicStub, ask
import capture_bedrock  # BedrockStub, ask
import capture_google_genai  # GeminiStubHandler, GeminiRag

OUT = Path(__file__).resolve().parent
PROVIDERS = ("anthropic", "anthropic_nosdk", "google_genai", "bedrock")
DISTRIBUTIONS = (
    "openlit",
    "anthropic",
    "httpx2",
    "httpx",
    "google-genai",
    "boto3",
    "botocore",
    "urllib3",
    "requests",
    "openai",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-instrumentation",
    "opentelemetry-semantic-conventions",
    "opentelemetry-exporter-otlp-proto-common",
    "opentelemetry-instrumentation-httpx",
    "opentelemetry-instrumentation-requests",
    "opentelemetry-instrumentation-urllib3",
    "wrapt",
)
KEYS = ("first", "token", "stream", "operation", "time", "kind", "model", "usage", "system", "provider", "http")


def versions() -> dict[str, str]:
    found = {}
    for name in DISTRIBUTIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def setup(provider_name: str) -> tuple[Any, Any]:
    """Our TracerProvider, set globally, then ``openlit.init`` as capture_openlit.py does it."""
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    service = f"rag-openlit-{provider_name}"
    provider = TracerProvider(resource=Resource.create({"service.name": service, "tenant.id": capture.TENANT}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    import openlit

    pricing = Path(tempfile.mkdtemp(prefix="openlit-")) / "pricing.json"
    pricing.write_text("{}")
    openlit.init(service_name=service, disable_metrics=True, disable_events=True, pricing_json=str(pricing))
    return provider, exporter


def run_anthropic(provider: Any, nosdk: bool) -> tuple[list[dict[str, Any]], Any]:
    import anthropic

    server, base_url = capture_anthropic.serve()
    options: dict[str, Any] = {"open_telemetry": False} if nosdk else {}
    client = anthropic.Anthropic(base_url=base_url, api_key="stub-key", max_retries=0, timeout=10.0, **options)
    tracer = provider.get_tracer("rag-api")
    truth = [capture_anthropic.ask("openlit", tracer, client, case) for case in capture_anthropic.CASES]
    return truth, server


def run_google_genai(provider: Any) -> tuple[list[dict[str, Any]], Any]:
    server, base_url = capture_google_genai.serve()
    service = capture_google_genai.GeminiRag("openlit", provider, base_url)
    service.warm_up()
    truth = [service.ask(case, warm_up=True) for case in capture_google_genai.CASES]
    return truth, server


def run_bedrock(provider: Any) -> tuple[list[dict[str, Any]], Any]:
    import boto3
    from botocore.config import Config

    server, endpoint = capture_bedrock.serve()
    config = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=10)
    client = boto3.client("bedrock-runtime", endpoint_url=endpoint, config=config)  # after openlit.init
    tracer = provider.get_tracer("rag-api")
    truth = [capture_bedrock.ask("openlit", tracer, client, case) for case in capture_bedrock.CASES]
    return truth, server


def run_provider(provider_name: str, out: Path) -> None:
    provider, exporter = setup(provider_name)
    if provider_name.startswith("anthropic"):
        truth, server = run_anthropic(provider, nosdk=provider_name == "anthropic_nosdk")
    elif provider_name == "google_genai":
        truth, server = run_google_genai(provider)
    else:
        truth, server = run_bedrock(provider)
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    name = f"openlit_{provider_name}"
    capture.write_traces(out / f"{name}.otlp", spans, truth)
    doc = {"library": name, "versions": versions(), "tenant": capture.TENANT, "traces": truth}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    capture.print_spans(spans, truth, KEYS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--provider", choices=PROVIDERS, help="run one provider (this process)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    # fake AWS credentials and a region: the stub checks no signature, and nothing leaves loopback
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "AKIDSTUBSTUBSTUBSTUB")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "stub-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.pop("AWS_PROFILE", None)
    if args.provider:
        run_provider(args.provider, args.out)
        return
    for name in PROVIDERS:  # one process each: OpenLIT patches the clients once per process
        cmd = [sys.executable, __file__, "--provider", name, "--out", str(args.out)]
        subprocess.run(cmd, check=True, timeout=120)
        print(f"{name}: {args.out / f'openlit_{name}.otlp'}")


if __name__ == "__main__":
    main()
