// Capture the spans the Vercel AI SDK (`ai` + `@ai-sdk/openai`) exports with experimental_telemetry for an agent
// WITH A TOOL (multi-step: `stopWhen: stepCountIs(3)`): the first model turn streams (or returns) a tool call, the
// SDK runs the tool (its `ai.toolCall` span), the second turn streams (or returns) the answer.
// The stub is ../capture_tools.py's (capture.py's OpenAI-compatible stub plus tool calls): a chat request that
// offers `tools` and holds no `role: "tool"` message is answered with a call of `lookup_capital`
// ({"country": "France"}; streamed: tool_calls deltas then finish_reason "tool_calls"), any other with capture.py's
// answer (first chunk 120 ms after the request, streamed or not).
//
// Three requests under a root span "POST /ask", each after a 40 ms span "retrieve"
// (gen_ai.operation.name = retrieval), as ../vercel/capture.mjs:
//   1. tool_stream: streamText with the tool lookup_capital (its execute sleeps 30 ms), stopWhen stepCountIs(3);
//   2. tool_non_stream: generateText, the same tool and stop condition;
//   3. stream: streamText offering no tool (the model answers directly), the control.
// One warm-up run of each case first (no root span), not written.
//
//   cd tests/data/otel_instrumentations/vercel_tools && npm ci
//   (cd .. && python3 -c "import capture_tools, time; s, u = capture_tools.serve(); print(u, flush=True); time.sleep(120)") &
//   node capture_tools.mjs <the printed base URL, ending in /v1> [outdir]
//
// Writes <outdir>/vercel_tools.otlp (4-byte big-endian length + ExportTraceServiceRequest per trace, as the
// Collector's Kafka exporter carries them) and vercel_tools.json (what the client saw, the versions): the keys of
// ../vercel/capture.mjs's vercel.json (the ns times as JSON integers here), and for the tool cases, as
// ../capture_tools.py's tools_*.json: turn1_called_ns (= called_ns), turn1_first_chunk_ns (the tool call's first
// part the caller saw in fullStream; streaming only), turn1_done_ns (the SDK starts the tool:
// experimental_onToolCallStart), tool_done_ns (experimental_onToolCallFinish), turn2_called_ns (step 2 starts:
// experimental_onStepStart), and first_chunk_ns = the first text-delta of the answer in fullStream (streaming only).
// The control case has no turn keys.
import { writeFileSync, readFileSync } from 'node:fs';
import { trace, SpanKind } from '@opentelemetry/api';
import { NodeTracerProvider, SimpleSpanProcessor, InMemorySpanExporter } from '@opentelemetry/sdk-trace-node';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { streamText, generateText, tool, stepCountIs } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { z } from 'zod';

const baseURL = process.argv[2];
const outDir = process.argv[3] || '/tmp/vai';
if (!baseURL) throw new Error('usage: node capture_tools.mjs <baseURL> [outdir]');

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
const prompt = 'What is the capital of France? Look it up.';
const CASES = ['tool_stream', 'tool_non_stream', 'stream'];
const TOOL_WORK_MS = 30;

// Epoch ns from the same clock OTel JS uses for span timestamps (timeOrigin + performance.now()).
const nowNs = () => BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const tools = {
  lookup_capital: tool({
    description: 'The capital city of a country.',
    inputSchema: z.object({ country: z.string().describe("The country's name.") }),
    execute: async ({ country }) => {
      if (country !== 'France') throw new Error(`unexpected tool input ${country}`);
      await sleep(TOOL_WORK_MS);
      return 'Paris';
    },
  }),
};

// One request's LLM work; what the client saw (ns, BigInt or null). The turn boundaries come from the SDK's own
// callbacks: the tool starting (turn 1's tool call received) and step 2 starting (turn 2 called).
async function turns(kase) {
  const seen = { called_ns: nowNs(), first_chunk_ns: null };
  const withTools = kase !== 'stream';
  const options = {
    model, prompt, experimental_telemetry: telemetry, maxRetries: 0,
    ...(withTools ? { tools, stopWhen: stepCountIs(3) } : {}),
    experimental_onToolCallStart: () => { if (seen.turn1_done_ns === undefined) seen.turn1_done_ns = nowNs(); },
    experimental_onToolCallFinish: () => { if (seen.tool_done_ns === undefined) seen.tool_done_ns = nowNs(); },
    experimental_onStepStart: (e) => { if (e.stepNumber === 1) seen.turn2_called_ns = nowNs(); },
  };
  let text = '';
  if (kase === 'tool_non_stream') {
    const result = await generateText(options);
    text = result.text;
    if (result.steps.length !== 2) throw new Error(`expected 2 steps, got ${result.steps.length}`);
  } else {
    const result = streamText(options);
    let steps = 0;
    for await (const part of result.fullStream) {
      const t = nowNs();
      if (part.type === 'start-step') {
        steps += 1;
      } else if (part.type.startsWith('tool-input') || part.type === 'tool-call') {
        if (seen.turn1_first_chunk_ns === undefined) seen.turn1_first_chunk_ns = t;
      } else if (part.type === 'text-delta') {
        if (seen.first_chunk_ns === null) seen.first_chunk_ns = t;
        text += part.text;
      } else if (part.type === 'error') {
        throw part.error;
      }
    }
    await result.usage; // make sure the SDK has finished (and ended its spans)
    if (steps !== (withTools ? 2 : 1)) throw new Error(`unexpected number of steps ${steps}`);
  }
  if (text !== 'Paris is the capital.') throw new Error(`unexpected answer ${JSON.stringify(text)}`);
  seen.answered_ns = nowNs();
  if (withTools) seen.turn1_called_ns = seen.called_ns;
  return seen;
}

async function ask(kase) {
  return tracer.startActiveSpan('POST /ask', { kind: SpanKind.SERVER }, async (root) => {
    const started_ns = nowNs();
    try {
      await tracer.startActiveSpan('retrieve', { attributes: { 'gen_ai.operation.name': 'retrieval' } }, async (s) => {
        await sleep(40);
        s.end();
      });
      const seen = await turns(kase);
      const out = {
        case: kase,
        trace_id: root.spanContext().traceId,
        streaming: kase !== 'tool_non_stream',
        started_ns,
        called_ns: seen.called_ns,
        first_chunk_ns: seen.first_chunk_ns,
        answered_ns: seen.answered_ns,
      };
      for (const k of ['turn1_called_ns', 'turn1_first_chunk_ns', 'turn1_done_ns', 'tool_done_ns', 'turn2_called_ns']) {
        if (seen[k] !== undefined) out[k] = seen[k];
      }
      return out;
    } finally {
      root.end();
    }
  });
}

for (const kase of CASES) await turns(kase); // warm-up, not written
await sleep(50);
exporter.reset();

const truth = [];
for (const kase of CASES) truth.push(await ask(kase));
await sleep(50);
await provider.forceFlush();
const spans = exporter.getFinishedSpans();

const SHOWN = /finishReason|finish_reasons|msToFirstChunk|^gen_ai\.|^ai\.toolCall\.|operation|^ai\.model|^ai\.settings\.maxSteps|^ai\.response\.(id|model|timestamp)|^ai\.usage/;
const short = (v) => { const s = JSON.stringify(v); return s.length > 120 ? s.slice(0, 117) + '...' : s; };
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
  const relNs = (ns) => (ns === null || ns === undefined ? '-' : '+' + (Number(BigInt(ns) - r0) / 1e6).toFixed(1));
  console.log(`\n=== ${t.case}  trace ${t.trace_id}  spans=${mine.length}`);
  console.log(`client (ms from the root's start): root entered ${relNs(t.started_ns)}, called ${relNs(t.called_ns)}, ` +
    `turn1 first part ${relNs(t.turn1_first_chunk_ns)}, turn1 done/tool start ${relNs(t.turn1_done_ns)}, tool done ${relNs(t.tool_done_ns)}, turn2 called ${relNs(t.turn2_called_ns)}, ` +
    `first text chunk ${relNs(t.first_chunk_ns)}, answered ${relNs(t.answered_ns)}`);
  const sorted = [...mine].sort((a, b) => (a === root ? -1 : b === root ? 1 : Number(hrToNs(a.startTime) - hrToNs(b.startTime))));
  for (const s of sorted) {
    const parent = s.parentSpanContext?.spanId ?? s.parentSpanId ?? '';
    const parentName = parent ? (mine.find((p) => p.spanContext().spanId === parent)?.name ?? '?') : '-';
    console.log(`- ${s.name}  kind=${s.kind} parent=${parentName}  ` +
      `start +${rel(s.startTime)} end +${rel(s.endTime)} (dur ${(Number(hrToNs(s.endTime) - hrToNs(s.startTime)) / 1e6).toFixed(1)})`);
    for (const e of s.events) {
      console.log(`    event ${e.name} @ +${rel(e.time)} ${JSON.stringify(e.attributes ?? {})}`);
    }
    for (const [k, v] of Object.entries(s.attributes)) {
      if (process.env.ALL_ATTRS || SHOWN.test(k)) console.log(`    ${k} = ${short(v)}`);
    }
  }
}
writeFileSync(`${outDir}/vercel_tools.otlp`, Buffer.concat(chunks));
const versions = {};
for (const p of ['ai', '@ai-sdk/openai', 'zod', '@opentelemetry/sdk-trace-base', '@opentelemetry/sdk-trace-node', '@opentelemetry/resources', '@opentelemetry/api', '@opentelemetry/otlp-transformer']) {
  versions[p] = JSON.parse(readFileSync(new URL(`./node_modules/${p}/package.json`, import.meta.url), 'utf8')).version;
}
// ns as JSON integers (exact: Python's json reads them as ints)
const doc = JSON.stringify({ library: 'vercel_ai', versions, tenant: 'acme', node: process.version, traces: truth },
  (k, v) => (typeof v === 'bigint' ? `__ns__${v}` : v), 1).replace(/"__ns__(\d+)"/g, '$1');
writeFileSync(`${outDir}/vercel_tools.json`, doc + '\n');
console.log(`\nwrote ${outDir}/vercel_tools.otlp (${truth.length} messages) and vercel_tools.json`);
await provider.shutdown();
