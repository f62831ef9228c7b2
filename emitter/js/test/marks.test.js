'use strict';
// The caller's first token marked in the trace (markFirstToken, firstTokenMarked), on a fake @opentelemetry/api;
// the Vercel AI SDK 5 against the loopback stub is captured in tests/data/otel_instrumentations/azure_node
// (vercel_ai5_marked) and read by tests/unit/test_otlp_azure_frameworks.py.
const test = require('node:test');
const assert = require('node:assert/strict');
const { callerText, firstTokenMarked, markFirstToken, STAGE_ATTR } = require('..');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const nowMs = () => performance.timeOrigin + performance.now();

/** A fake API: one active context (changeable), a tracer whose spans record how they were made. */
function fakeApi() {
  const spans = [];
  const api = {
    activeContext: 'ctx-at-call',
    context: { active: () => api.activeContext },
    trace: {
      getTracerProvider: () => ({
        getTracer: (scope) => ({
          startSpan(name, options, parent) {
            const span = { scope, name, options, parent, endTime: null, end: (t) => (span.endTime = t) };
            spans.push(span);
            return span;
          },
        }),
      }),
    },
  };
  return { api, spans };
}

async function* textStream(items, handed) {
  for (const item of items) {
    await sleep(5);
    handed.push(nowMs());
    yield item;
  }
}

test('the first text item is marked once, under the context active at the call, items unchanged', async () => {
  const { api, spans } = fakeApi();
  const handed = [];
  const items = ['', 'Paris', ' is', ' the'];
  const marked = firstTokenMarked(textStream(items, handed), { api });
  api.activeContext = 'another-ctx'; // the SDK's own context while it streams
  const got = [];
  for await (const item of marked) got.push(item);
  assert.deepEqual(got, items);
  assert.equal(spans.length, 1);
  const [span] = spans;
  assert.equal(span.name, 'first token');
  assert.equal(span.scope, 'ttft-emit-otel');
  assert.deepEqual(span.options.attributes, { [STAGE_ATTR]: 'first_token' });
  assert.equal(span.parent, 'ctx-at-call');
  assert.deepEqual(span.endTime, span.options.startTime); // zero length
  const atMs = span.options.startTime[0] * 1e3 + span.options.startTime[1] / 1e6;
  assert.ok(handed[1] - 1 <= atMs && atMs < handed[2], `${atMs} not at the second item ${handed}`);
});

test('no text, a failing predicate or a broken API: no mark, the items still flow', async () => {
  const { api, spans } = fakeApi();
  const items = ['', { type: 'text-delta', text: '' }, { type: 'finish' }];
  const got = [];
  for await (const item of firstTokenMarked(items, { api })) got.push(item);
  assert.deepEqual(got, items);
  const boom = () => {
    throw new Error('predicate');
  };
  got.length = 0;
  for await (const item of firstTokenMarked(['a', 'b'], { api, isToken: boom })) got.push(item);
  assert.deepEqual(got, ['a', 'b']);
  assert.equal(spans.length, 0);
  const broken = { context: { active: () => undefined }, trace: { getTracerProvider: () => null } };
  got.length = 0;
  for await (const item of firstTokenMarked(['a'], { api: broken })) got.push(item);
  assert.deepEqual(got, ['a']);
  markFirstToken({ api: broken }); // nothing thrown
});

test('callerText: strings and text-delta parts with text (ai 5: text, ai 4: textDelta)', () => {
  assert.equal(callerText('Paris'), true);
  assert.equal(callerText(''), false);
  assert.equal(callerText({ type: 'text-delta', text: 'Paris' }), true);
  assert.equal(callerText({ type: 'text-delta', textDelta: 'Paris' }), true);
  assert.equal(callerText({ type: 'text-delta', text: '' }), false);
  assert.equal(callerText({ type: 'tool-call', toolName: 'lookup' }), false);
  assert.equal(callerText({ type: 'response-metadata' }), false);
  assert.equal(callerText(null), false);
});

test('markFirstToken at a given time', () => {
  const { api, spans } = fakeApi();
  markFirstToken({ api, atMs: 1_700_000_000_123.5 });
  assert.deepEqual(spans[0].options.startTime, [1_700_000_000, 123_500_000]);
  assert.equal(spans[0].parent, 'ctx-at-call');
});
