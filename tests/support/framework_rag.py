"""A LangChain RAG service traced by a real framework instrumentation, exporting OTLP to a Collector.

The service is ``tests/data/otel_instrumentations/capture_langchain.py``'s (:class:`LangChainRag`: an LCEL chain
with LangChain's ``EnsembleRetriever`` of BM25 and a vector store, a prompt and ``ChatOpenAI``, against capture.py's
loopback stub, first chunk 120 ms after the request), under OpenInference's or OpenLLMetry's LangChain and OpenAI
instrumentors, in a venv of its own (``requirements-langchain.txt``). Spans go to the Collector with the SDK's
``BatchSpanProcessor`` and OTLP/HTTP exporter; a copy stays in memory so the service can write what its own
spans say (:func:`tests.support.instrumented_rag.span_doc`). No ``ttft.*`` attribute anywhere; the tenant is the
resource attribute ``tenant.id``. ``--first-chunk-helper``: ttft-emit's ``time_first_chunk(llm.root_client)``.

Usage (the venv's python): ``python tests/support/framework_rag.py --library openinference --endpoint
http://127.0.0.1:4318 --tenant lc-openinference --requests 24 --out truth.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "otel_instrumentations"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "emitter" / "src"))  # as pip install ttft-emit would

import capture
from capture_langchain import LIBRARIES, LangChainRag, instrument, versions
from instrumented_rag import attach_spans, export_processors

#: Every ``NON_STREAM_EVERY``-th request does not stream.
NON_STREAM_EVERY = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", choices=sorted(LIBRARIES), required=True)
    parser.add_argument("--endpoint", required=True, help="OTLP/HTTP base URL of the Collector")
    parser.add_argument("--tenant", required=True, help="the resource attribute tenant.id")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--first-chunk-helper", action="store_true", help="time_first_chunk(llm.root_client)")
    args = parser.parse_args()

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    kept, processors = export_processors(args.endpoint)
    resource = {"service.name": f"rag-langchain-{args.library}", "tenant.id": args.tenant}
    provider = TracerProvider(resource=Resource.create(resource))
    for processor in processors:
        provider.add_span_processor(processor)
    instrument(args.library, provider)
    server, base_url = capture.serve()
    service = LangChainRag(provider, base_url)
    helper = args.first_chunk_helper
    truth = []
    for i in range(args.requests):
        streaming = i % NON_STREAM_EVERY != NON_STREAM_EVERY - 1
        truth.append(service.ask("stream" if streaming else "non_stream", streaming, helper))
    server.shutdown()
    attach_spans(provider, kept, truth, f"framework_rag ({args.library})")
    doc = {"library": args.library, "tenant": args.tenant, "versions": versions(args.library), "requests": truth}
    args.out.write_text(json.dumps(doc))


if __name__ == "__main__":
    main()
