'use strict';
// ttft-emit-otel on fakes shaped as the openai Node client and the three instrumentations are (`node --test`);
// the real client under the real instrumentations is captured in tests/data/otel_instrumentations/openai_node
// (`--helper`) and read by tests/unit/test_otlp_providers.py.
const test = require('node:test');
const assert = require('node:assert/strict');
const { FirstChunkTiming, isOutput, timeFirstChunk, FIRST_CHUNK_ATTR, STREAM_ATTR } = require('..');

const FIRST_TOKEN_MS = 60;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const nowMs = () => performance.timeOrigin + performance.now();

/** A span as the SDK's: attributes, startTime as [s, ns], isRecording until end(). */
class FakeSpan {
  constructor(name, attributes = {}, startMs = nowMs()) {
    this.name = name;
    this.attributes = { ...attributes };
    this.startTime = [Math.floor(startMs / 1e3), Math.round((startMs % 1e3) * 1e6)];
    this.ended = false;
  }
  setAttribute(k, v) {
    if (!this.ended) this.attributes[k] = v;
    return this;
  }
  isRecording() {
    return !this.ended;
  }
  end() {
    this.ended = true;
  }
}

/** A tracer whose spans go through `processor.onStart`, as an SDK provider's do. */
function tracer(processor, spans) {
  return {
    startSpan(name, options = {}) {
      const span = new FakeSpan(name, options.attributes, options.startTime);
      spans.push(span);
      processor.onStart(span);
      return span;
    },
  };
}

/** The openai client's Stream: read through its `iterator` property. */
class Stream {
  constructor(types, onDone) {
    this.iterator = async function* () {
      await sleep(5);
      let waited = false;
      for (const type of types) {
        if (!waited && isOutput(type === null ? {} : { type })) {
          await sleep(FIRST_TOKEN_MS);
          waited = true;
        }
        yield type === null ? { choices: [{ delta: { content: 'x' } }] } : { type };
      }
      onDone();
    };
  }
  [Symbol.asyncIterator]() {
    return this.iterator();
  }
}

/** An APIPromise: a promise with `_thenUnwrap` and `withResponse`. */
function apiPromise(value) {
  const p = Promise.resolve(value);
  p._thenUnwrap = (f) => apiPromise(p.then(f));
  p.withResponse = async () => ({ data: await p, response: { ok: true } });
  return p;
}

const CHAT = [null, null, null];
const RESPONSES = ['response.created', 'response.in_progress', 'response.output_text.delta', 'response.completed'];

/** `resource.create` as an instrumentation patches it: its span starts in the call, ends with the stream (or, with
 * `endAtHeaders`, when the call's promise resolves). */
function resource(t, { name = 'chat gpt-x', attributes = { 'gen_ai.operation.name': 'chat' }, types = CHAT, endAtHeaders = false } = {}) {
  return {
    create(body) {
      const span = t.startSpan(name, { attributes });
      if (!body.stream) {
        span.end();
        return apiPromise({ choices: [{ message: { content: 'x' } }] });
      }
      if (endAtHeaders) span.end();
      return apiPromise(new Stream(types, () => span.end()));
    },
  };
}

async function read(stream) {
  let first = null;
  for await (const chunk of stream) {
    if (first === null && isOutput(chunk)) first = nowMs();
  }
  return first;
}

test('a streamed chat call gets its first chunk and stream flag on the LLM span', async () => {
  const timing = new FirstChunkTiming();
  const spans = [];
  const client = { chat: { completions: resource(tracer(timing.spanProcessor(), spans)) } };
  timing.instrument(client);
  const promise = client.chat.completions.create({ model: 'gpt-x', stream: true });
  assert.equal(typeof promise.withResponse, 'function'); // still an APIPromise
  const first = await read(await promise);
  const [span] = spans;
  const measured = span.startTime[0] * 1e3 + span.startTime[1] / 1e6 + span.attributes[FIRST_CHUNK_ATTR] * 1e3;
  assert.ok(span.attributes[FIRST_CHUNK_ATTR] >= FIRST_TOKEN_MS / 1e3);
  assert.ok(Math.abs(measured - first) < 2, `${measured} vs ${first}`);
  assert.equal(span.attributes[STREAM_ATTR], true);
  assert.deepEqual(timing.stats, { calls: 1, spans: 1, firstChunks: 1, unmatched: 0, errors: 0, filled: 0 });
});

test('a plain call is marked not streaming and returned unchanged', async () => {
  const timing = new FirstChunkTiming();
  const spans = [];
  const client = { chat: { completions: resource(tracer(timing.spanProcessor(), spans)) } };
  timing.instrument(client);
  const answer = await client.chat.completions.create({ model: 'gpt-x' });
  assert.equal(answer.choices[0].message.content, 'x');
  assert.equal(spans[0].attributes[STREAM_ATTR], false);
  assert.equal(FIRST_CHUNK_ATTR in spans[0].attributes, false);
});

test('a Responses stream is timed at its first delta, not at response.created', async () => {
  const timing = new FirstChunkTiming();
  const spans = [];
  const oi = { name: 'OpenAI Responses', attributes: { 'openinference.span.kind': 'LLM' }, types: RESPONSES };
  const client = { responses: resource(tracer(timing.spanProcessor(), spans), oi) };
  timing.instrument(client);
  await read(await client.responses.create({ model: 'gpt-x', stream: true }));
  assert.ok(spans[0].attributes[FIRST_CHUNK_ATTR] >= FIRST_TOKEN_MS / 1e3);
});

test('tee() and a second iteration go through the timed iterator once', async () => {
  const timing = new FirstChunkTiming();
  const spans = [];
  const client = { chat: { completions: resource(tracer(timing.spanProcessor(), spans)) } };
  timing.instrument(client);
  const stream = await client.chat.completions.create({ model: 'gpt-x', stream: true });
  const chunks = [];
  for await (const c of stream.iterator()) chunks.push(c);
  assert.equal(chunks.length, CHAT.length);
  assert.equal(timing.stats.firstChunks, 1);
});

test('a span ended with the headers gets nothing, and with fillMissing the helper makes its own', async () => {
  for (const fill of [false, true]) {
    const timing = new FirstChunkTiming();
    const spans = [];
    const t = tracer(timing.spanProcessor(), spans);
    const api = { SpanKind: { CLIENT: 2 }, context: { active: () => undefined } };
    if (fill) timing.fillMissingSpans({ getTracer: () => t }, api);
    const client = { responses: resource(t, { name: 'openai.response', types: RESPONSES, endAtHeaders: true }) };
    timing.instrument(client);
    const called = nowMs();
    await read(await client.responses.create({ model: 'gpt-x', stream: true }));
    const theirs = spans.find((s) => s.name === 'openai.response');
    assert.equal(FIRST_CHUNK_ATTR in theirs.attributes, false);
    if (!fill) {
      assert.equal(timing.stats.errors, 1);
      continue;
    }
    const ours = spans.find((s) => s.name === 'chat gpt-x');
    const oursStart = ours.startTime[0] * 1e3 + ours.startTime[1] / 1e6;
    assert.ok(oursStart >= called - 1 && oursStart <= called + 5);
    assert.ok(ours.attributes[FIRST_CHUNK_ATTR] >= FIRST_TOKEN_MS / 1e3 && ours.ended);
    assert.equal(timing.stats.filled, 1);
  }
});

test('instrument wraps once, only what the client has; timeFirstChunk needs addSpanProcessor', () => {
  const timing = new FirstChunkTiming();
  const client = { chat: { completions: { create() {} } }, responses: { create: 5 } };
  timing.instrument(client);
  const once = client.chat.completions.create;
  timing.instrument(client);
  assert.equal(client.chat.completions.create, once);
  assert.equal(client.responses.create, 5);
  assert.throws(() => timeFirstChunk(client, { tracerProvider: {} }), /spanProcessors/);
  const added = [];
  const stats = timeFirstChunk({}, { tracerProvider: { addSpanProcessor: (p) => added.push(p) } }).stats;
  assert.equal(added.length, 1);
  assert.equal(stats.calls, 0);
});

test('concurrent calls each time their own span', async () => {
  const timing = new FirstChunkTiming();
  const spans = [];
  const client = { chat: { completions: resource(tracer(timing.spanProcessor(), spans)) } };
  timing.instrument(client);
  await Promise.all([1, 2, 3].map(async () => read(await client.chat.completions.create({ model: 'gpt-x', stream: true }))));
  assert.equal(spans.length, 3);
  for (const span of spans) assert.ok(span.attributes[FIRST_CHUNK_ATTR] >= FIRST_TOKEN_MS / 1e3);
  assert.equal(timing.stats.firstChunks, 3);
});

test('a chat chunk with the role alone or no choices is no output', () => {
  assert.equal(isOutput({ choices: [{ index: 0, delta: { role: 'assistant', content: '' } }] }), false);
  assert.equal(isOutput({ choices: [], prompt_filter_results: [{}] }), false); // Azure OpenAI's first chunk
  assert.equal(isOutput({ choices: [{ delta: { content: 'Par' } }] }), true);
  assert.equal(isOutput({ choices: [{ delta: { tool_calls: [{ index: 0 }] } }] }), true);
  assert.equal(isOutput({ choices: [{ text: 'Par' }] }), true); // legacy completions
  assert.equal(isOutput({ type: 'response.created' }), false);
  assert.equal(isOutput('text'), true);
});
