// Capture the spans unmodified Node libraries export for Azure OpenAI's streamed chat completions, whose first
// chunks carry no output: against the loopback stub of ../capture_prefill_chunks.py (PrefillStubHandler, serve()),
// which answers Azure OpenAI's paths (/openai/deployments/<deployment>/chat/completions?api-version=..., and
// .../embeddings) and sends, right after a stream's headers, Azure's `prompt_filter_results` chunk
// ("choices": [], empty id / object / model, created 0) and a role-only chunk (delta {role, content: ""}), then
// the content chunks 120 ms later (../capture.py's FIRST_CHUNK_DELAY_S, 30 ms apart); a plain call after 150 ms.
//
// Set-ups (one node process each: the instrumentations patch the same client), all pointed at the Azure host
// https://ttft-rag.openai.azure.com, every request sent to 127.0.0.1 by a custom `fetch` (loopbackFetch: origin
// rewritten to http://127.0.0.1:<stub port>, path and query kept):
//   vercel         the Vercel AI SDK (`ai` 6) with `@ai-sdk/azure` 3:
//                    createAzure({ resourceName: 'ttft-rag', apiKey: 'stub-key', apiVersion: '2024-10-21',
//                                  useDeploymentBasedUrls: true, fetch })
//                  `azure.chat('gpt-4o-mini')` (chat completions: `azure('...')` alone is the Responses API) with
//                  `experimental_telemetry: { isEnabled: true }`; streamText (consumed through textStream) and
//                  generateText. `useDeploymentBasedUrls` gives the deployments URL the stub answers
//                  (/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21); without it the
//                  provider calls Azure's v1 API (/openai/v1/chat/completions?api-version=v1), same chunks, same
//                  model class. The retrieval span is a 40 ms sleep, as ../vercel/capture.mjs's.
//   vercel_ai5     the same with `ai` 5 and `@ai-sdk/azure` 2 (vercel_ai5/package.json: `npm ci` there too; loaded
//                  from vercel_ai5/node_modules, their CommonJS builds; the OpenTelemetry SDK is this folder's).
//   vercel_ai5_marked
//                  vercel_ai5 with the caller's textStream wrapped in this repository's emitter/js
//                  firstTokenMarked: a zero-length span ttft.stage = first_token at the first text.
//   openinference  the `openai` client's AzureOpenAI under @arizeai/openinference-instrumentation-openai
//   openllmetry    ... under @traceloop/instrumentation-openai
//   otel           ... under @opentelemetry/instrumentation-openai (opentelemetry-js-contrib)
//                    new AzureOpenAI({ endpoint: 'https://ttft-rag.openai.azure.com', apiVersion: '2024-10-21',
//                                      apiKey: 'stub-key', maxRetries: 0, fetch })
//                  (no `deployment`: each call's `model` goes into the path), `openai` loaded with require after
//                  registerInstrumentations (require-in-the-middle patches it), as ../openai_node/capture.mjs.
//                  The retrieval span (the library's convention) is around an embeddings call (deployment
//                  text-embedding-3-small) and 10 ms of vector search, then 25 ms of prompt work.
//   <openinference|openllmetry|otel>_helper
//                  the same plus this repository's emitter/js (ttft-emit-otel: FirstChunkTiming, its span
//                  processor first, fillMissingSpans, instrument(client)), as ../openai_node/capture.mjs --helper.
//
// Three requests per set-up, each a trace under a root span "POST /ask" (SERVER): stream, non_stream, stream2
// (a second stream). One untraced warm-up call of each kind first (not written).
//
// Truth per trace (<name>.json "traces"): case, trace_id, streaming, started_ns (root entered), called_ns (just
// before the call), first_bytes_ns (the stream's first body bytes through the custom fetch: the filter chunk),
// first_any_chunk_ns (the first chunk of any kind the caller got: the openai client's filter chunk; for the
// Vercel AI SDK, whose caller never sees it, first_bytes_ns), first_chunk_ns (the caller's first text: the
// first chunk with a non-empty choices[].delta.content, the first textStream value), early_chunks (openai
// client: chunks before it), answered_ns (the stream consumed / the plain call returned). Epoch ns, the clock of
// OpenTelemetry JS's span times (performance.timeOrigin + performance.now()).
//
//   cd tests/data/otel_instrumentations/azure_node && npm ci && (cd vercel_ai5 && npm ci)
//   node capture.mjs [SETUP...] [--out DIR]       # per set-up: the stub (python3 -c ... capture_prefill_chunks
//                                                # .serve()) in a child, the set-up in a node child (120 s)
//   unshare -rn sh -c 'ip link set lo up && exec node capture.mjs'   # no network but the loopback
//   node capture.mjs --setup otel --port <stub port> [--out DIR]
//
// Each set-up's process refuses (throws) any socket connection or name lookup whose host is not 127.0.0.1
// (net.Socket.prototype.connect, dns.lookup / dns.promises.lookup wrapped) and counts them: json "azure.network".
// The orchestrator adds what the stub got (method, path with query, Host, key header): "azure.stub_requests".
//
// Writes <out>/azure_node_<set-up>.otlp (4-byte big-endian length + ExportTraceServiceRequest per trace) and
// azure_node_<set-up>.json; <out> is .. (tests/data/otel_instrumentations) by default.
import { writeFileSync, readFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { dirname, resolve } from 'node:path';
import net from 'node:net';
import dns from 'node:dns';

const HERE = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const LOOPBACK = '127.0.0.1';
const AZURE_ENDPOINT = 'https://ttft-rag.openai.azure.com';
const AZURE_RESOURCE = 'ttft-rag';
const AZURE_API_VERSION = '2024-10-21';
const LIBRARIES = {
  openinference: '@arizeai/openinference-instrumentation-openai',
  openllmetry: '@traceloop/instrumentation-openai',
  otel: '@opentelemetry/instrumentation-openai',
};
// Where each Vercel set-up's `ai` and `@ai-sdk/azure` are installed.
const VERCEL_DIRS = { vercel: HERE, vercel_ai5: resolve(HERE, 'vercel_ai5') };
const SETUPS = [
  ...Object.keys(VERCEL_DIRS), 'vercel_ai5_marked', ...Object.keys(LIBRARIES), ...Object.keys(LIBRARIES).map((l) => `${l}_helper`),
];
const OTEL_PACKAGES = ['@opentelemetry/api', '@opentelemetry/sdk-trace-base', '@opentelemetry/sdk-trace-node',
  '@opentelemetry/resources', '@opentelemetry/otlp-transformer'];
const CASES = ['stream', 'non_stream', 'stream2'];
const MODEL = 'gpt-4o-mini'; // the chat deployment
const EMBEDDING_MODEL = 'text-embedding-3-small'; // the embeddings deployment
const QUESTION = 'What is the capital of France?';
const VECTOR_SEARCH_MS = 10;
const PROMPT_WORK_MS = 25;
const KEYS = /first|token|stream|operation|span\.kind|model|provider|system|server|url|api|azure|deployment|filter|response\.id/i;

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const outDir = resolve(opt('--out', resolve(HERE, '..')));

// Epoch ns from the clock OTel JS uses for span times.
const nowNs = () => BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const version = (p, dir = HERE) => JSON.parse(readFileSync(resolve(dir, 'node_modules', p, 'package.json'), 'utf8')).version;
/** A package installed in `dir` (its `require` entry: CommonJS for `ai` 5 and `@ai-sdk/azure` 2). */
const importFrom = (dir, name) => import(pathToFileURL(createRequire(resolve(dir, 'package.json')).resolve(name)).href);

if (opt('--setup')) await runSetup(opt('--setup'), Number(opt('--port')));
else await orchestrate();

/** Per set-up: the Python stub in a child (its port on stdout), the set-up in a node child, then the stub's log. */
async function orchestrate() {
  const python = process.env.PYTHON || 'python3';
  const code = 'import sys, json; sys.path.insert(0, sys.argv[1]); import capture_prefill_chunks as c; ' +
    's, u = c.serve(); print(s.server_address[1], flush=True); sys.stdin.read(); ' +
    'print(json.dumps(s.requests), flush=True); s.shutdown()';
  const chosen = args.filter((a) => SETUPS.includes(a));
  for (const setup of chosen.length ? chosen : SETUPS) {
    const stub = spawn(python, ['-c', code, resolve(HERE, '..')], { stdio: ['pipe', 'pipe', 'inherit'] });
    const killer = setTimeout(() => stub.kill(), 150_000);
    let out = '';
    stub.stdout.on('data', (d) => { out += String(d); });
    const port = await new Promise((ok, fail) => {
      const check = () => { if (out.includes('\n')) { stub.stdout.off('data', check); ok(Number(out.split('\n')[0])); } };
      stub.stdout.on('data', check);
      stub.once('exit', (c) => fail(new Error(`stub exited ${c}`)));
    });
    console.log(`# ${setup}: stub at http://${LOOPBACK}:${port}`);
    try {
      const child = spawn(process.execPath, [fileURLToPath(import.meta.url), '--setup', setup, '--port', String(port),
        '--out', outDir], { stdio: 'inherit', timeout: 120_000 });
      const rc = await new Promise((ok) => child.once('exit', ok));
      if (rc !== 0) throw new Error(`${setup}: exit ${rc}`);
    } finally {
      stub.stdin.end();
    }
    await new Promise((ok) => stub.once('exit', ok));
    clearTimeout(killer);
    const requests = JSON.parse(out.trim().split('\n').at(-1));
    const file = resolve(outDir, `azure_node_${setup}.json`);
    // the epoch ns are JSON integers past 2**53: splice the stub's log into the text, before "traces"
    const text = readFileSync(file, 'utf8');
    const azure = { ...JSON.parse(text).azure, stub_requests: requests };
    const azureJson = JSON.stringify(azure, null, 1).replace(/\n/g, '\n ');
    writeFileSync(file, text.replace(/\n "azure": \{[\s\S]*?\n \},\n "traces"/, () => `\n "azure": ${azureJson},\n "traces"`));
    console.log(`# ${setup}: stub got ${JSON.stringify(requests)}`);
  }
}

/** Refuse and count every connection and name lookup of this process whose host is not the loopback. */
function guardNetwork(seen) {
  const count = (what, host) => {
    const key = `${what} ${host}`;
    seen[key] = (seen[key] || 0) + 1;
    if (host !== LOOPBACK) throw new Error(`${what} ${host}: this capture connects to ${LOOPBACK} only`);
  };
  const connect = net.Socket.prototype.connect;
  net.Socket.prototype.connect = function (...a) {
    let first = a[0];
    if (Array.isArray(first)) first = first[0]; // net.connect's normalized arguments
    if (first && typeof first === 'object') {
      if (first.path === undefined) count('connect', first.host ?? 'localhost');
    } else if (typeof first === 'number' || (typeof first === 'string' && /^\d+$/.test(first))) {
      count('connect', typeof a[1] === 'string' ? a[1] : 'localhost');
    }
    return connect.apply(this, a);
  };
  const lookup = dns.lookup;
  dns.lookup = function (host, ...rest) {
    count('dns.lookup', host);
    return lookup.call(this, host, ...rest);
  };
  const plookup = dns.promises.lookup;
  dns.promises.lookup = function (host, ...rest) {
    count('dns.promises.lookup', host);
    return plookup.call(this, host, ...rest);
  };
}

/** A fetch sending each request to http://127.0.0.1:<port> (path and query kept), logging each request with when
 * its response headers and first body bytes came. */
function loopbackFetch(port, log) {
  const realFetch = globalThis.fetch;
  return async (input, init) => {
    const original = typeof input === 'string' || input instanceof URL ? String(input) : input.url;
    const url = new URL(original);
    url.protocol = 'http:';
    url.hostname = LOOPBACK;
    url.port = String(port);
    const rec = { url: original, sent_to: url.toString(), fetch_ns: nowNs(), headers_ns: null, first_bytes_ns: null };
    log.push(rec);
    const res = await realFetch(input instanceof Request ? new Request(url, input) : url, init);
    rec.headers_ns = nowNs();
    rec.status = res.status;
    if (!res.body) return res;
    const reader = res.body.getReader();
    const body = new ReadableStream({
      async pull(controller) {
        const { done, value } = await reader.read();
        if (done) {
          controller.close();
          return;
        }
        rec.first_bytes_ns ??= nowNs();
        controller.enqueue(value);
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    });
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}

async function runSetup(setup, port) {
  if (!SETUPS.includes(setup) || !port) throw new Error('usage: node capture.mjs --setup NAME --port PORT [--out DIR]');
  const network = {};
  guardNetwork(network);
  const otelApi = await import('@opentelemetry/api');
  const { trace, SpanKind } = otelApi;
  const { NodeTracerProvider, SimpleSpanProcessor, InMemorySpanExporter } = await import('@opentelemetry/sdk-trace-node');
  const { resourceFromAttributes } = await import('@opentelemetry/resources');
  const { ProtobufTraceSerializer } = await import('@opentelemetry/otlp-transformer');

  const helper = setup.endsWith('_helper');
  const marked = setup.endsWith('_marked'); // the caller's first text marked by emitter/js's firstTokenMarked
  const lib = setup.replace(/_(helper|marked)$/, '');
  const fetchLog = [];
  const fetch = loopbackFetch(port, fetchLog);
  const exporter = new InMemorySpanExporter();
  const timing = helper ? new (require(resolve(HERE, '../../../../emitter/js')).FirstChunkTiming)() : null;
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'rag-api-node', 'service.version': '1.4.2', 'tenant.id': 'acme' }),
    spanProcessors: [...(timing ? [timing.spanProcessor()] : []), new SimpleSpanProcessor(exporter)],
  });
  provider.register();
  const tracer = trace.getTracer('rag-api-node');

  let call; // (streaming) -> what the caller saw
  let retrieve;
  let clientInfo;
  const versions = {};
  if (lib in VERCEL_DIRS) {
    const dir = VERCEL_DIRS[lib];
    const { streamText, generateText } = lib === 'vercel' ? await import('ai') : await importFrom(dir, 'ai');
    const { createAzure } = lib === 'vercel' ? await import('@ai-sdk/azure') : await importFrom(dir, '@ai-sdk/azure');
    const azure = createAzure({
      resourceName: AZURE_RESOURCE, apiKey: 'stub-key', apiVersion: AZURE_API_VERSION, useDeploymentBasedUrls: true, fetch,
    });
    const model = azure.chat(MODEL);
    const telemetry = { isEnabled: true };
    clientInfo = {
      client: "@ai-sdk/azure createAzure(...).chat('gpt-4o-mini')",
      options: { resourceName: AZURE_RESOURCE, apiKey: 'stub-key', apiVersion: AZURE_API_VERSION, useDeploymentBasedUrls: true },
      model_provider: model.provider,
    };
    retrieve = () => tracer.startActiveSpan('retrieve', { attributes: { 'gen_ai.operation.name': 'retrieval' } }, async (s) => {
      await sleep(40);
      s.end();
    });
    call = async (streaming) => {
      const seen = { first_bytes_ns: null, first_any_chunk_ns: null, first_chunk_ns: null };
      const at = fetchLog.length;
      const called_ns = nowNs();
      if (streaming) {
        const result = streamText({ model, prompt: QUESTION, experimental_telemetry: telemetry, maxRetries: 0 });
        const texts = marked
          ? require(resolve(HERE, '../../../../emitter/js')).firstTokenMarked(result.textStream, { api: otelApi })
          : result.textStream;
        for await (const text of texts) {
          if (seen.first_chunk_ns === null && text) seen.first_chunk_ns = nowNs();
        }
        await result.usage; // the SDK has finished (and ended its spans)
      } else {
        await generateText({ model, prompt: QUESTION, experimental_telemetry: telemetry, maxRetries: 0 });
      }
      const answered_ns = nowNs();
      const req = fetchLog.slice(at).find((r) => r.url.includes('/chat/completions'));
      if (streaming) {
        seen.first_bytes_ns = req?.first_bytes_ns ?? null;
        seen.first_any_chunk_ns = seen.first_bytes_ns; // the caller never sees the filter chunk: its bytes' arrival
      }
      return { called_ns, headers_ns: req?.headers_ns ?? null, ...seen, answered_ns };
    };
    for (const p of ['ai', '@ai-sdk/azure', '@ai-sdk/openai', '@ai-sdk/provider-utils']) versions[p] = version(p, dir);
    for (const p of OTEL_PACKAGES) versions[p] = version(p);
    if (dir !== HERE) versions['@opentelemetry/api (ai\'s)'] = version('@opentelemetry/api', dir);
  } else {
    const { registerInstrumentations } = await import('@opentelemetry/instrumentation');
    const { OpenAIInstrumentation } = await import(LIBRARIES[lib]);
    registerInstrumentations({ instrumentations: [new OpenAIInstrumentation()], tracerProvider: provider });
    const { AzureOpenAI } = require('openai'); // after registerInstrumentations: require-in-the-middle patches it
    const client = new AzureOpenAI({
      endpoint: AZURE_ENDPOINT, apiVersion: AZURE_API_VERSION, apiKey: 'stub-key', maxRetries: 0, timeout: 20_000, fetch,
    });
    if (timing) {
      timing.fillMissingSpans(provider, require('@opentelemetry/api'));
      timing.instrument(client);
    }
    clientInfo = {
      client: 'openai AzureOpenAI',
      options: { endpoint: AZURE_ENDPOINT, apiVersion: AZURE_API_VERSION, apiKey: 'stub-key', maxRetries: 0 },
      base_url: client.baseURL,
    };
    retrieve = async () => {
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
    };
    call = async (streaming) => {
      const seen = { first_bytes_ns: null, first_any_chunk_ns: null, first_chunk_ns: null };
      const messages = [{ role: 'user', content: QUESTION }];
      const at = fetchLog.length;
      const called_ns = nowNs();
      let returned_ns;
      let early = 0;
      if (streaming) {
        const stream = await client.chat.completions.create({ model: MODEL, messages, stream: true, stream_options: { include_usage: true } });
        returned_ns = nowNs();
        for await (const chunk of stream) {
          const now = nowNs();
          seen.first_any_chunk_ns ??= now;
          if (seen.first_chunk_ns === null) {
            if (chunk.choices?.some((c) => c.delta?.content)) seen.first_chunk_ns = now;
            else early += 1;
          }
        }
      } else {
        await client.chat.completions.create({ model: MODEL, messages });
        returned_ns = nowNs();
      }
      const answered_ns = nowNs();
      const req = fetchLog.slice(at).find((r) => r.url.includes('/chat/completions'));
      if (streaming) seen.first_bytes_ns = req?.first_bytes_ns ?? null;
      return { called_ns, headers_ns: req?.headers_ns ?? null, returned_ns, ...seen, ...(streaming ? { early_chunks: early } : {}), answered_ns };
    };
    versions[LIBRARIES[lib]] = version(LIBRARIES[lib]);
    for (const p of ['openai', '@opentelemetry/instrumentation', ...OTEL_PACKAGES]) versions[p] = version(p);
    if (helper || marked) versions['ttft-emit-otel'] = JSON.parse(readFileSync(resolve(HERE, '../../../../emitter/js/package.json'), 'utf8')).version;
  }

  async function ask(kase) {
    return tracer.startActiveSpan('POST /ask', { kind: SpanKind.SERVER }, async (root) => {
      const started_ns = nowNs();
      try {
        await retrieve();
        await sleep(PROMPT_WORK_MS);
        const seen = await call(kase !== 'non_stream');
        return { case: kase, trace_id: root.spanContext().traceId, streaming: kase !== 'non_stream', retrieval_attempts: 1, started_ns, ...seen };
      } finally {
        root.end();
      }
    });
  }

  for (const streaming of [true, false]) await call(streaming); // warm-up, not written
  await sleep(200);
  await provider.forceFlush();
  exporter.reset();
  const warmStats = timing ? { ...timing.stats } : null;
  const truth = [];
  for (const kase of CASES) {
    truth.push(await ask(kase));
    await sleep(200); // OpenInference ends a stream's span when its tee'd copy is consumed
  }
  await provider.forceFlush();
  const spans = exporter.getFinishedSpans();

  const name = `azure_node_${setup}`;
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
      `call ${rel(t.called_ns)}, headers ${rel(t.headers_ns)}, first bytes ${rel(t.first_bytes_ns)}, first any chunk ${rel(t.first_any_chunk_ns)}, ` +
      `first content chunk ${rel(t.first_chunk_ns)}, answered ${rel(t.answered_ns)}`);
    const sorted = [...mine].sort((a, b) => Number(hrToNs(a.startTime) - hrToNs(b.startTime)));
    for (const s of sorted) {
      const parent = s.parentSpanContext?.spanId;
      const parentName = parent ? (mine.find((p) => p.spanContext().spanId === parent)?.name ?? '?') : '-';
      const sc = s.instrumentationScope;
      console.log(`  ${JSON.stringify(s.name).padEnd(28)} scope=${sc.name}/${sc.version} kind=${SpanKind[s.kind]} parent=${JSON.stringify(parentName)} ` +
        `start=${rel(hrToNs(s.startTime))} end=${rel(hrToNs(s.endTime))} dur=${(Number(hrToNs(s.endTime) - hrToNs(s.startTime)) / 1e6).toFixed(1)}`);
      for (const e of s.events) console.log(`      event ${JSON.stringify(e.name)} at ${rel(hrToNs(e.time))} ${JSON.stringify(e.attributes ?? {}).slice(0, 200)}`);
      for (const [k, v] of Object.entries(s.attributes)) {
        if (process.env.ALL_ATTRS || KEYS.test(k)) console.log(`      ${k} = ${JSON.stringify(v).slice(0, 200)}`);
      }
    }
  }
  writeFileSync(resolve(outDir, `${name}.otlp`), Buffer.concat(chunks));
  const doc = {
    library: lib,
    setup,
    versions,
    tenant: 'acme',
    node: process.version,
    ...(lib in VERCEL_DIRS ? {} : { openai_loaded: 'require (CommonJS)' }),
    ...(timing ? { helper: 'ttft-emit-otel FirstChunkTiming (fillMissing)', helper_stats_warm: warmStats, helper_stats: timing.stats } : {}),
    azure: {
      ...clientInfo,
      fetch: `loopbackFetch: each request to http://${LOOPBACK}:<the stub's port>, path and query kept`,
      requests: [...new Set(fetchLog.map((r) => `${r.url} -> ${r.sent_to.replace(/:\d+\//, ':<port>/')}`))],
      network,
    },
    traces: truth,
  };
  const text = JSON.stringify(doc, (k, v) => (typeof v === 'bigint' ? `__ns__${v}` : v), 1).replace(/"__ns__(\d+)"/g, '$1');
  writeFileSync(resolve(outDir, `${name}.json`), text + '\n');
  console.log(`\n# network: ${JSON.stringify(network)}`);
  console.log(`wrote ${outDir}/${name}.otlp (${truth.length} messages, ${spans.length} spans) and ${name}.json`);
  await provider.shutdown();
  process.exit(0);
}
