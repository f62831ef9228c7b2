// Capture the spans the Vercel AI SDK (`ai` + `@ai-sdk/openai`) exports with experimental_telemetry,
// against the loopback OpenAI-compatible stub of ../capture.py (first chunk 120 ms after the request).
// Three requests under a root span "POST /ask", each after a 40 ms span "retrieve"
// (gen_ai.operation.name = retrieval): streaming (cold), not streaming, streaming (warm).
//
//   cd tests/data/otel_instrumentations/vercel && npm ci
//   (cd .. && python3 -c "import capture, time; s, u = capture.serve(); print(u, flush=True); time.sleep(120)") &
//   node capture.mjs <the printed base URL, ending in /v1> ..
//
// Writes <outdir>/vercel.otlp (4-byte big-endian length + ExportTraceServiceRequest per trace, as the
// Collector's Kafka exporter carries them) and vercel.json (what the client saw, the versions).
import { writeFileSync, readFileSync } from 'node:fs';
import { trace, SpanKind } from '@opentelemetry/api';
import { NodeTracerProvider, SimpleSpanProcessor, InMemorySpanExporter } from '@opentelemetry/sdk-trace-node';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { streamText, generateText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';

const baseURL = process.argv[2];
const outDir = process.argv[3] || '/tmp/vai';
if (!baseURL) throw new Error('usage: node capture.mjs <baseURL> [outdir]');

const exporter = new InMemorySpanExporter();
const provider = new NodeTracerProvider({
  resource: resourceFromAttributes({ 'service.name': 'rag-vercel', 'tenant.id': 'acme' }),
  spanProcessors: [new SimpleSpanProcessor(exporter)],
});
provider.register();
const tracer = trace.getTracer('rag-vercel');

const openai = createOpenAI({ baseURL, apiKey: 'stub-key' });
const model = openai.chat('gpt-4o-mini');
const telemetry = { isEnabled: true };
const prompt = 'What is the capital of France?';

// Epoch ns from the same clock OTel JS uses for span timestamps (timeOrigin + performance.now()).
const nowNs = () => BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function ask(kase) {
  return tracer.startActiveSpan('POST /ask', { kind: SpanKind.SERVER }, async (root) => {
    const started_ns = nowNs();
    try {
      await tracer.startActiveSpan('retrieve', { attributes: { 'gen_ai.operation.name': 'retrieval' } }, async (s) => {
        await sleep(40);
        s.end();
      });
      const called_ns = nowNs();
      let first_chunk_ns = null;
      if (kase === 'non_stream') {
        await generateText({ model, prompt, experimental_telemetry: telemetry, maxRetries: 0 });
      } else {
        const result = streamText({ model, prompt, experimental_telemetry: telemetry, maxRetries: 0 });
        for await (const chunk of result.textStream) {
          if (first_chunk_ns === null) first_chunk_ns = nowNs();
        }
        await result.usage; // make sure the SDK has finished (and ended its spans)
      }
      const answered_ns = nowNs();
      return {
        case: kase,
        trace_id: root.spanContext().traceId,
        streaming: kase !== 'non_stream',
        started_ns: started_ns.toString(),
        called_ns: called_ns.toString(),
        first_chunk_ns: first_chunk_ns === null ? null : first_chunk_ns.toString(),
        answered_ns: answered_ns.toString(),
      };
    } finally {
      root.end();
    }
  });
}

const truth = [];
for (const kase of ['stream', 'non_stream', 'stream2']) truth.push(await ask(kase));
await sleep(50);
await provider.forceFlush();
const spans = exporter.getFinishedSpans();

const hrToNs = (t) => BigInt(t[0]) * 1000000000n + BigInt(t[1]);
const chunks = [];
for (const t of truth) {
  const mine = spans.filter((s) => s.spanContext().traceId === t.trace_id);
  const bytes = ProtobufTraceSerializer.serializeRequest(mine);
  const len = Buffer.alloc(4);
  len.writeUInt32BE(bytes.length);
  chunks.push(len, Buffer.from(bytes));

  // table
  const root = mine.find((s) => s.name === 'POST /ask');
  const r0 = hrToNs(root.startTime);
  const rel = (t) => (Number(hrToNs(t) - r0) / 1e6).toFixed(1);
  const relNs = (ns) => (Number(BigInt(ns) - r0) / 1e6).toFixed(1);
  console.log(`\n=== ${t.case}  trace ${t.trace_id}  spans=${mine.length}`);
  console.log(`client: root entered +${relNs(t.started_ns)} ms, called +${relNs(t.called_ns)} ms, first chunk ${t.first_chunk_ns ? '+' + relNs(t.first_chunk_ns) : '-'} ms, ` +
    `first_chunk-called ${t.first_chunk_ns ? (Number(BigInt(t.first_chunk_ns) - BigInt(t.called_ns)) / 1e6).toFixed(1) : '-'} ms, first_chunk-started ${t.first_chunk_ns ? (Number(BigInt(t.first_chunk_ns) - BigInt(t.started_ns)) / 1e6).toFixed(1) : '-'} ms, answered +${relNs(t.answered_ns)} ms`);
  const sorted = [...mine].sort((a, b) => (a === root ? -1 : b === root ? 1 : Number(hrToNs(a.startTime) - hrToNs(b.startTime))));
  for (const s of sorted) {
    const parent = s.parentSpanContext?.spanId ?? s.parentSpanId ?? '';
    const parentName = parent ? (mine.find((p) => p.spanContext().spanId === parent)?.name ?? '?') : '-';
    console.log(`- ${s.name}  [opId=${s.attributes['ai.operationId'] ?? ''}] kind=${s.kind} parent=${parentName}  ` +
      `start +${rel(s.startTime)} end +${rel(s.endTime)} (dur ${(Number(hrToNs(s.endTime) - hrToNs(s.startTime)) / 1e6).toFixed(1)})`);
    for (const e of s.events) {
      console.log(`    event ${e.name} @ +${rel(e.time)} ${JSON.stringify(e.attributes ?? {})}`);
    }
    for (const [k, v] of Object.entries(s.attributes)) {
      if (process.env.ALL_ATTRS || /msToFirstChunk|stream|operation/i.test(k)) console.log(`    ${k} = ${JSON.stringify(v)}`);
    }
  }
}
writeFileSync(`${outDir}/vercel.otlp`, Buffer.concat(chunks));
const versions = {};
for (const p of ['ai', '@ai-sdk/openai', '@opentelemetry/sdk-trace-base', '@opentelemetry/sdk-trace-node', '@opentelemetry/resources', '@opentelemetry/api', '@opentelemetry/otlp-transformer']) {
  versions[p] = JSON.parse(readFileSync(new URL(`./node_modules/${p}/package.json`, import.meta.url), 'utf8')).version;
}
writeFileSync(`${outDir}/vercel.json`, JSON.stringify({ library: 'vercel_ai', versions, tenant: 'acme', node: process.version, traces: truth }, null, 1) + '\n');
console.log(`\nwrote ${outDir}/vercel.otlp (${truth.length} messages) and vercel.json`);
await provider.shutdown();
