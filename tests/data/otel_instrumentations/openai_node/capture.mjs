// Capture the spans that the official `openai` Node client (v6) gets from unmodified JS instrumentations,
// against the loopback stub of ../capture_responses.py (chat completions as ../capture.py's: first chunk
// 120 ms after the request, 30 ms apart, a plain answer after 150 ms, usage 812 prompt / 512 cached; the
// Responses API: response.created at once, the first output_text.delta 120 ms after the request).
//
// Libraries (one process each: they patch the same client), `openai` loaded through `require` (the
// CommonJS path every README shows; require-in-the-middle patches it on load):
//   openinference  @arizeai/openinference-instrumentation-openai
//   openllmetry    @traceloop/instrumentation-openai
//   otel           @opentelemetry/instrumentation-openai (opentelemetry-js-contrib)
//
// Three requests per library, each a trace: a root span "POST /ask" (SERVER), the retrieval span of the
// library's convention (OpenInference kind RETRIEVER; else gen_ai.operation.name = retrieval) around an
// embeddings call and 10 ms of vector search (~50 ms), 25 ms of prompt work, then the call:
//   stream           chat.completions.create({stream: true, stream_options: {include_usage: true}}), for await
//   non_stream       chat.completions.create({...})
//   responses_stream responses.create({stream: true}), for await
// One untraced call of each case comes first and is not written (the client's first call loads and
// builds its types, which a long-running service pays once).
//
//   cd tests/data/otel_instrumentations/openai_node && npm ci
//   node capture.mjs [LIBRARY...] [--out DIR]  # starts the stub (python3 ../capture_responses.py's serve()),
//                                         # runs each library in a process of its own, stops the stub
//   node capture.mjs --library otel --base-url <stub URL ending in /v1> [--out DIR] [--esm]
//
// Writes <out>/openai_node_<library>.otlp (4-byte big-endian length + ExportTraceServiceRequest per trace,
// as the Collector's Kafka exporter carries them) and openai_node_<library>.json (what the client saw per
// trace: called_ns, first_chunk_ns = the first content delta / output_text.delta, answered_ns; versions).
// <out> is .. (tests/data/otel_instrumentations) by default.
//
// --esm: load `openai` with `import()` instead (ESM: require-in-the-middle never sees it); then
// OpenInference and OpenLLMetry are patched with their manuallyInstrument() (OpenInference takes the module
// namespace, OpenLLMetry the OpenAI class), and the OpenTelemetry one, which has none, not at all unless
// node runs with its import-in-the-middle loader. Files are then named openai_node_<library>_esm.*.
import { writeFileSync, readFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { dirname, resolve } from 'node:path';
import { trace, SpanKind } from '@opentelemetry/api';
import { NodeTracerProvider, SimpleSpanProcessor, InMemorySpanExporter } from '@opentelemetry/sdk-trace-node';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { registerInstrumentations } from '@opentelemetry/instrumentation';

const HERE = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const LIBRARIES = {
  openinference: '@arizeai/openinference-instrumentation-openai',
  openllmetry: '@traceloop/instrumentation-openai',
  otel: '@opentelemetry/instrumentation-openai',
};
const OTHER_PACKAGES = ['openai', '@opentelemetry/api', '@opentelemetry/sdk-trace-base', '@opentelemetry/sdk-trace-node',
  '@opentelemetry/resources', '@opentelemetry/otlp-transformer', '@opentelemetry/instrumentation'];
const CASES = ['stream', 'non_stream', 'responses_stream'];
const MODEL = 'gpt-4o-mini';
const EMBEDDING_MODEL = 'text-embedding-3-small';
const QUESTION = 'What is the capital of France?';
const VECTOR_SEARCH_MS = 10; // after the embeddings call (40 ms at the stub): a ~50 ms retrieval
const PROMPT_WORK_MS = 25;
const KEYS = /first|token|stream|operation|span\.kind|model|invocation|time/i;

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const library = opt('--library');
const esm = args.includes('--esm');
const helper = args.includes('--helper');
const outDir = resolve(opt('--out', resolve(HERE, '..')));

// Epoch ns from the clock OTel JS uses for span times (timeOrigin + performance.now(); a span's start is
// Date.now() in whole ms, its end and events that start plus performance.now() deltas).
const nowNs = () => BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const version = (p) => JSON.parse(readFileSync(resolve(HERE, 'node_modules', p, 'package.json'), 'utf8')).version;

if (!library) await orchestrate();
else await runLibrary(library);

/** The stub in a python3 child, then each library in a node child of its own (120 s each), then stop the stub. */
async function orchestrate() {
  const python = process.env.PYTHON || 'python3';
  const code = 'import sys, time; sys.path.insert(0, sys.argv[1]); import capture_responses as c; ' +
    's, u = c.serve(); print(u, flush=True); sys.stdin.read(); s.shutdown()';
  const stub = spawn(python, ['-c', code, resolve(HERE, '..')], { stdio: ['pipe', 'pipe', 'inherit'] });
  const killer = setTimeout(() => stub.kill(), 600_000);
  const baseURL = await new Promise((ok, fail) => {
    stub.stdout.once('data', (d) => ok(String(d).trim()));
    stub.once('exit', (c) => fail(new Error(`stub exited ${c}`)));
  });
  console.log(`stub at ${baseURL}`);
  try {
    const chosen = args.filter((a) => a in LIBRARIES);
    for (const lib of chosen.length ? chosen : Object.keys(LIBRARIES)) {
      const child = spawn(process.execPath, [...process.execArgv, fileURLToPath(import.meta.url), '--library', lib,
        '--base-url', baseURL, '--out', outDir, ...(esm ? ['--esm'] : []), ...(helper ? ['--helper'] : [])],
      { stdio: 'inherit', timeout: 120_000 });
      const rc = await new Promise((ok) => child.once('exit', ok));
      if (rc !== 0) throw new Error(`${lib}: exit ${rc}`);
    }
  } finally {
    stub.stdin.end();
    clearTimeout(killer);
    setTimeout(() => stub.kill(), 2_000).unref();
  }
}

async function runLibrary(lib) {
  const baseURL = opt('--base-url');
  if (!(lib in LIBRARIES) || !baseURL) throw new Error('usage: node capture.mjs --library NAME --base-url URL [--out DIR] [--esm]');
  const exporter = new InMemorySpanExporter();
  // --helper: ttft-emit-otel (this repository's emitter/js), its processor first, fillMissing for the Responses
  // span @traceloop/instrumentation-openai ends with the headers.
  const timing = helper ? new (require(resolve(HERE, '../../../../emitter/js')).FirstChunkTiming)() : null;
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'rag-api-node', 'service.version': '1.4.2', 'tenant.id': 'acme' }),
    spanProcessors: [...(timing ? [timing.spanProcessor()] : []), new SimpleSpanProcessor(exporter)],
  });
  provider.register();
  const { OpenAIInstrumentation } = await import(LIBRARIES[lib]);
  const instrumentation = new OpenAIInstrumentation();
  registerInstrumentations({ instrumentations: [instrumentation], tracerProvider: provider });

  let OpenAI;
  if (esm) {
    const mod = await import('openai');
    OpenAI = mod.default;
    if (lib === 'openinference') instrumentation.manuallyInstrument(mod);
    if (lib === 'openllmetry') instrumentation.manuallyInstrument(OpenAI);
  } else {
    OpenAI = require('openai').OpenAI; // after registerInstrumentations: require-in-the-middle patches it
  }
  const client = new OpenAI({ baseURL, apiKey: 'stub-key', maxRetries: 0, timeout: 20_000 });
  if (timing) {
    timing.fillMissingSpans(provider, require('@opentelemetry/api'));
    timing.instrument(client);
  }
  const tracer = trace.getTracer('rag-api-node');

  async function retrieve() {
    const [name, opts] = lib === 'openinference'
      ? ['retrieve', { attributes: { 'openinference.span.kind': 'RETRIEVER', 'input.value': QUESTION } }]
      : ['retrieval docs', { kind: SpanKind.CLIENT, attributes: { 'gen_ai.operation.name': 'retrieval', 'gen_ai.data_source.id': 'docs' } }];
    await tracer.startActiveSpan(name, opts, async (s) => {
      try {
        await client.embeddings.create({ model: EMBEDDING_MODEL, input: QUESTION });
        await sleep(VECTOR_SEARCH_MS);
      } finally {
        s.end();
      }
    });
  }

  /** The LLM call of `kase`; when the client made it, got it back, saw its first event and first content delta. */
  async function call(kase) {
    const seen = { first_event_ns: null, first_chunk_ns: null };
    const messages = [{ role: 'user', content: QUESTION }];
    const called_ns = nowNs();
    let returned_ns;
    if (kase === 'stream') {
      const stream = await client.chat.completions.create({ model: MODEL, messages, stream: true, stream_options: { include_usage: true } });
      returned_ns = nowNs();
      for await (const chunk of stream) {
        const now = nowNs();
        seen.first_event_ns ??= now;
        if (seen.first_chunk_ns === null && chunk.choices?.[0]?.delta?.content) seen.first_chunk_ns = now;
      }
    } else if (kase === 'responses_stream') {
      const stream = await client.responses.create({ model: MODEL, input: QUESTION, stream: true });
      returned_ns = nowNs();
      for await (const event of stream) {
        const now = nowNs();
        seen.first_event_ns ??= now;
        if (seen.first_chunk_ns === null && event.type === 'response.output_text.delta') seen.first_chunk_ns = now;
      }
    } else {
      await client.chat.completions.create({ model: MODEL, messages });
      returned_ns = nowNs();
    }
    return { called_ns, returned_ns, ...seen, answered_ns: nowNs() };
  }

  async function ask(kase) {
    return tracer.startActiveSpan('POST /ask', { kind: SpanKind.SERVER }, async (root) => {
      const started_ns = nowNs();
      try {
        await retrieve();
        await sleep(PROMPT_WORK_MS);
        const seen = await call(kase);
        return {
          case: kase,
          trace_id: root.spanContext().traceId,
          streaming: kase !== 'non_stream',
          retrieval_attempts: 1,
          started_ns,
          ...seen,
        };
      } finally {
        root.end();
      }
    });
  }

  const clockSkewMs = () => Date.now() - (performance.timeOrigin + performance.now());
  const skewBefore = clockSkewMs();
  for (const kase of CASES) await call(kase); // warm-up, not written
  await client.embeddings.create({ model: EMBEDDING_MODEL, input: QUESTION });
  await sleep(200); // OpenInference ends a stream's span when its tee'd copy is consumed
  const truth = [];
  for (const kase of CASES) {
    truth.push(await ask(kase));
    await sleep(200);
  }
  await provider.forceFlush();
  const spans = exporter.getFinishedSpans();
  const skewAfter = clockSkewMs();

  const name = `openai_node_${lib}${esm ? '_esm' : ''}${helper ? '_helper' : ''}`;
  const chunks = [];
  const hrToNs = (t) => BigInt(t[0]) * 1000000000n + BigInt(t[1]);
  for (const t of truth) {
    const mine = spans.filter((s) => s.spanContext().traceId === t.trace_id);
    const bytes = ProtobufTraceSerializer.serializeRequest(mine);
    const len = Buffer.alloc(4);
    len.writeUInt32BE(bytes.length);
    chunks.push(len, Buffer.from(bytes));

    const root = mine.find((s) => s.name === 'POST /ask');
    const r0 = hrToNs(root.startTime);
    const rel = (ns) => (ns === null || ns === undefined ? '-' : (Number(BigInt(ns) - r0) / 1e6).toFixed(1));
    console.log(`\n=== ${name} ${t.case}  trace ${t.trace_id}  spans=${mine.length}  client (ms from root start): entered ${rel(t.started_ns)}, ` +
      `call ${rel(t.called_ns)}, returned ${rel(t.returned_ns)}, first event ${rel(t.first_event_ns)}, first chunk ${rel(t.first_chunk_ns)}, answered ${rel(t.answered_ns)}`);
    const sorted = [...mine].sort((a, b) => Number(hrToNs(a.startTime) - hrToNs(b.startTime)));
    for (const s of sorted) {
      const parent = s.parentSpanContext?.spanId;
      const parentName = parent ? (mine.find((p) => p.spanContext().spanId === parent)?.name ?? '?') : '-';
      const sc = s.instrumentationScope;
      console.log(`  ${JSON.stringify(s.name).padEnd(28)} scope=${sc.name}/${sc.version} kind=${SpanKind[s.kind]} parent=${JSON.stringify(parentName)} ` +
        `start=${rel(hrToNs(s.startTime))} end=${rel(hrToNs(s.endTime))} dur=${(Number(hrToNs(s.endTime) - hrToNs(s.startTime)) / 1e6).toFixed(1)}`);
      for (const e of s.events) console.log(`      event ${JSON.stringify(e.name)} at ${rel(hrToNs(e.time))} ${JSON.stringify(e.attributes ?? {})}`);
      for (const [k, v] of Object.entries(s.attributes)) {
        if (process.env.ALL_ATTRS || KEYS.test(k)) console.log(`      ${k} = ${JSON.stringify(v).slice(0, 200)}`);
      }
    }
  }
  writeFileSync(resolve(outDir, `${name}.otlp`), Buffer.concat(chunks));
  const versions = { [LIBRARIES[lib]]: version(LIBRARIES[lib]) };
  for (const p of OTHER_PACKAGES) versions[p] = version(p);
  const doc = {
    library: lib,
    versions,
    tenant: 'acme',
    node: process.version,
    openai_loaded: esm ? 'import() (ESM)' + (lib === 'otel' ? '' : ', manuallyInstrument') : 'require (CommonJS)',
    date_now_minus_span_clock_ms: [Number(skewBefore.toFixed(3)), Number(skewAfter.toFixed(3))],
    ...(timing ? { helper: 'ttft-emit-otel FirstChunkTiming (fillMissing)', helper_stats: timing.stats } : {}),
    traces: truth,
  };
  // epoch ns as JSON integers (past 2**53: BigInt, written as digits)
  const text = JSON.stringify(doc, (k, v) => (typeof v === 'bigint' ? `__ns__${v}` : v), 1).replace(/"__ns__(\d+)"/g, '$1');
  writeFileSync(resolve(outDir, `${name}.json`), text + '\n');
  console.log(`\nwrote ${outDir}/${name}.otlp (${truth.length} messages, ${spans.length} spans finished in all) and ${name}.json`);
  await provider.shutdown();
  process.exit(0);
}
