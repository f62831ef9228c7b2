'use strict';
/**
 * The first chunk on the LLM span, for Node instrumentations of the `openai` client that record none.
 *
 * `@arizeai/openinference-instrumentation-openai`, `@traceloop/instrumentation-openai` and
 * `@opentelemetry/instrumentation-openai` record no first chunk of a streamed call, and the last two do not say
 * whether a call streamed: ttft-pipeline stores such requests `no_first_chunk` (docs/otlp-mapping.md). The
 * JavaScript counterpart of ttft-emit's Python helper (`ttft_emit.otel.time_first_chunk`), with the same rules:
 *
 *   const { FirstChunkTiming } = require('ttft-emit-otel');
 *   const timing = new FirstChunkTiming();
 *   const provider = new NodeTracerProvider({ spanProcessors: [timing.spanProcessor(), exportingProcessor] });
 *   // ... register the instrumentation, then, once per client:
 *   timing.instrument(client);  // client = new OpenAI(...)
 *
 * (`timeFirstChunk(client, { tracerProvider })` does both on an SDK 1.x provider, which still has
 * `addSpanProcessor`.) Each `chat.completions.create`, `completions.create` and `responses.create` of that client
 * then sets, on the LLM span the instrumentation starts inside the call (`gen_ai.operation.name` `chat` /
 * `text_completion` / `generate_content`, or OpenInference kind `LLM`; else the first span started inside a
 * streaming call, if it still records at the first chunk):
 *
 * - `gen_ai.request.stream` (boolean) when the span starts, from the call's `stream` field;
 * - `gen_ai.response.time_to_first_chunk` (seconds since the span's start) when the first chunk *of output*
 *   reaches the caller: a chunk without a string `type` (a chat completion chunk), or a typed event ending in
 *   `.delta` (the Responses API's `response.created` and `response.in_progress` carry no token).
 *
 * With `fillMissing: true` (and `@opentelemetry/api` installed), a streaming call whose LLM span ended before its
 * first chunk (`@traceloop/instrumentation-openai` ends its Responses span with the headers), or that started no
 * LLM span, gets the helper's own: `chat <model>` (CLIENT), from the call to the stream's end, a child of the
 * context current at the call, with its first chunk: the pipeline counts it and drops the span it holds.
 *
 * The stream is timed in place (its `iterator`, which `for await`, `tee()` and `toReadableStream()` go through),
 * and the caller gets the very promise and stream the client returned (`withResponse()`, `asResponse()` work). Never throws into
 * the service: what it could not do is counted in `stats`.
 */

const { AsyncLocalStorage } = require('node:async_hooks');

const FIRST_CHUNK_ATTR = 'gen_ai.response.time_to_first_chunk';
const STREAM_ATTR = 'gen_ai.request.stream';
const LLM_OPERATIONS = new Set(['chat', 'text_completion', 'generate_content']);
/** The methods `instrument` wraps, by attribute path from the client. */
const CLIENT_METHODS = [
  ['chat', 'completions', 'create'],
  ['completions', 'create'],
  ['responses', 'create'],
];
const WRAPPED = Symbol('ttftFirstChunk');

/** Epoch milliseconds with sub-millisecond precision (OpenTelemetry JS's clock). */
const nowMs = () => performance.timeOrigin + performance.now();

/** Whether a span's attributes name an LLM inference. */
function isLlmSpan(attributes) {
  if (!attributes) return false;
  return LLM_OPERATIONS.has(attributes['gen_ai.operation.name']) || attributes['openinference.span.kind'] === 'LLM';
}

/** What a chat-completions chunk's `choices[].delta` carries when it is output (the legacy API: `choices[].text`). */
const OUTPUT_DELTA_FIELDS = ['content', 'tool_calls', 'function_call', 'refusal', 'reasoning_content', 'reasoning'];

/**
 * Whether a streamed item carries output (the Python helper's `is_output`): a typed event only when it is a delta;
 * a chat-completions chunk only when a choice's delta carries some, not the role alone or no choices (Azure
 * OpenAI's `prompt_filter_results` chunk first); any other chunk does.
 */
function isOutput(chunk) {
  const isObject = chunk !== null && typeof chunk === 'object';
  const kind = isObject ? chunk.type : undefined;
  if (typeof kind === 'string') return kind === 'content_block_delta' || kind.endsWith('.delta');
  if (!isObject || !Array.isArray(chunk.choices)) return true;
  return chunk.choices.some(
    (choice) =>
      Boolean(choice && choice.text) ||
      OUTPUT_DELTA_FIELDS.some((name) => Boolean(choice && choice.delta && choice.delta[name])),
  );
}

/** A span's start in epoch milliseconds (SDK spans hold `startTime` as `[seconds, nanoseconds]`). */
function startMs(span) {
  const t = span && span.startTime;
  return Array.isArray(t) && t.length === 2 ? t[0] * 1e3 + t[1] / 1e6 : undefined;
}

class Call {
  constructor(stream, model) {
    this.stream = stream;
    this.model = typeof model === 'string' ? model : '';
    this.span = null;
    this.firstStarted = null;
    this.startedMs = 0;
    this.context = undefined;
    this.filler = null;
  }
}

class FirstChunkTiming {
  /** @param {{ fillMissing?: boolean, tracerProvider?: object, api?: object }} [options] */
  constructor(options = {}) {
    this._store = new AsyncLocalStorage();
    this._counts = { calls: 0, spans: 0, firstChunks: 0, unmatched: 0, errors: 0, filled: 0 };
    this._processor = null;
    this._tracer = null;
    if (options.fillMissing) this.fillMissingSpans(options.tracerProvider, options.api);
  }

  /** A snapshot of the counters. */
  get stats() {
    return { ...this._counts };
  }

  /** The span processor that matches a wrapped call's LLM span when it starts (the same object every time). */
  spanProcessor() {
    if (this._processor === null) {
      const timing = this;
      this._processor = {
        onStart(span) {
          timing._onStart(span);
        },
        onEnd() {},
        forceFlush() {
          return Promise.resolve();
        },
        shutdown() {
          return Promise.resolve();
        },
      };
    }
    return this._processor;
  }

  /**
   * From now on, a streaming call left without a recording LLM span at its first chunk gets the helper's own.
   * `api`: the service's `@opentelemetry/api` (by default the one `require` finds from here).
   */
  fillMissingSpans(tracerProvider, api) {
    if (api === undefined) {
      try {
        api = require('@opentelemetry/api');
      } catch {
        throw new Error('fillMissing needs @opentelemetry/api: install it, or pass it as the second argument');
      }
    }
    this._api = api;
    this._tracer = (tracerProvider || api.trace.getTracerProvider()).getTracer('ttft-emit-otel');
  }

  _onStart(span) {
    const call = this._store.getStore();
    if (call === undefined || call.span !== null) return;
    try {
      if (call.firstStarted === null) call.firstStarted = span;
      if (!isLlmSpan(span.attributes)) return;
      call.span = span;
      this._counts.spans += 1;
      span.setAttribute(STREAM_ATTR, call.stream);
    } catch {
      this._counts.errors += 1;
    }
  }

  /** Wrap the generating methods of an `openai` client (CLIENT_METHODS) on this object only; returns it. */
  instrument(client) {
    for (const path of CLIENT_METHODS) {
      let resource = client;
      for (const name of path.slice(0, -1)) resource = resource == null ? undefined : resource[name];
      const method = resource == null ? undefined : resource[path[path.length - 1]];
      if (typeof method !== 'function' || method[WRAPPED]) continue;
      resource[path[path.length - 1]] = this.wrap(method);
    }
    return client;
  }

  /** `create` wrapped: same arguments and result; a streaming result is timed in place. */
  wrap(create) {
    const timing = this;
    function timed(body, ...rest) {
      const call = new Call(Boolean(body && body.stream === true), body && body.model);
      call.startedMs = nowMs();
      if (timing._api) call.context = timing._api.context.active();
      timing._counts.calls += 1;
      const result = timing._store.run(call, () => create.call(this, body, ...rest));
      if (!call.stream) return timing._finished(call, result);
      // The stream is timed in place by a reaction registered before the caller's own (so it runs first), and
      // the caller gets the very promise the client returned: an APIPromise parses its response once and caches
      // it, where a new one (`_thenUnwrap`) would parse the body a second time if an instrumentation had already
      // read it (@opentelemetry/instrumentation-openai does: "Body has already been read").
      if (result && typeof result.then === 'function') {
        result.then(
          (value) => timing._finished(call, value),
          () => {},
        );
        return result;
      }
      return timing._finished(call, result);
    }
    timed[WRAPPED] = true;
    return timed;
  }

  _finished(call, value) {
    if (!call.stream) {
      // OpenInference's tracer sets its attributes just after the span starts (it masks them first): named by now.
      const late = call.span === null ? call.firstStarted : null;
      if (late !== null && isLlmSpan(late.attributes) && late.isRecording()) {
        call.span = late;
        this._counts.spans += 1;
        this._set(late, STREAM_ATTR, false);
      } else if (call.span === null) this._counts.unmatched += 1;
      return value;
    }
    try {
      timeStream(value, () => this._firstChunk(call), () => this._endFiller(call));
    } catch {
      this._counts.errors += 1;
    }
    return value;
  }

  _firstChunk(call) {
    let span = call.span;
    if (span === null && call.firstStarted !== null && call.firstStarted.isRecording()) {
      const attributes = call.firstStarted.attributes || {};
      const named = 'gen_ai.operation.name' in attributes || 'openinference.span.kind' in attributes;
      if (!named || isLlmSpan(attributes)) {
        span = call.span = call.firstStarted; // named only at its end (the Python helper's rule)
        this._counts.spans += 1;
        this._set(span, STREAM_ATTR, true);
      }
    }
    if ((span === null || !span.isRecording()) && this._tracer !== null) span = this._fill(call) || span;
    if (span === null) {
      this._counts.unmatched += 1;
      return;
    }
    const start = startMs(span);
    if (start === undefined || !span.isRecording()) {
      this._counts.errors += 1;
      return;
    }
    if (this._set(span, FIRST_CHUNK_ATTR, Math.max(nowMs() - start, 0) / 1e3)) this._counts.firstChunks += 1;
  }

  _fill(call) {
    try {
      const { SpanKind } = this._api;
      const attributes = { 'gen_ai.operation.name': 'chat', [STREAM_ATTR]: call.stream };
      if (call.model) attributes['gen_ai.request.model'] = call.model;
      const name = `chat ${call.model}`.trim();
      const options = { kind: SpanKind.CLIENT, attributes, startTime: call.startedMs };
      call.filler = call.span = this._tracer.startSpan(name, options, call.context);
      this._counts.filled += 1;
      return call.filler;
    } catch {
      this._counts.errors += 1;
      return null;
    }
  }

  _endFiller(call) {
    const filler = call.filler;
    call.filler = null;
    if (filler !== null) filler.end();
  }

  _set(span, key, value) {
    try {
      span.setAttribute(key, value);
      return true;
    } catch {
      this._counts.errors += 1;
      return false;
    }
  }
}

/**
 * Time `stream` in place: `onFirst` once, at its first chunk of output; `onEnd` once, when it ends (read to its
 * end, failed, or returned early). An `openai` `Stream` is read through its `iterator` property; any other async
 * iterable through `Symbol.asyncIterator`.
 */
function timeStream(stream, onFirst, onEnd) {
  const key = typeof stream.iterator === 'function' ? 'iterator' : Symbol.asyncIterator;
  const original = stream[key];
  if (typeof original !== 'function') throw new TypeError('not a stream');
  let first = onFirst;
  let end = onEnd;
  stream[key] = async function* timedIterator(...args) {
    try {
      for await (const chunk of { [Symbol.asyncIterator]: () => original.apply(stream, args) }) {
        if (first !== null && isOutput(chunk)) {
          const call = first;
          first = null;
          call();
        }
        yield chunk;
      }
    } finally {
      const call = end;
      end = null;
      if (call !== null) call();
    }
  };
  return stream;
}

/**
 * `timing.instrument(client)` with a new `FirstChunkTiming` whose processor is added to `tracerProvider` (an SDK
 * 1.x provider's `addSpanProcessor`; on 2.x pass `timing.spanProcessor()` in `spanProcessors` instead and call
 * `instrument`). Returns the timing (its `stats`).
 */
function timeFirstChunk(client, { tracerProvider, fillMissing = false, api } = {}) {
  const timing = new FirstChunkTiming({ fillMissing, tracerProvider, api });
  if (!tracerProvider || typeof tracerProvider.addSpanProcessor !== 'function') {
    throw new TypeError(
      'timeFirstChunk needs a tracer provider with addSpanProcessor (SDK 1.x); on SDK 2.x construct the provider ' +
        'with spanProcessors: [timing.spanProcessor(), ...] and call timing.instrument(client)',
    );
  }
  tracerProvider.addSpanProcessor(timing.spanProcessor());
  timing.instrument(client);
  return timing;
}

/** The span attribute that names a span's stage for ttft-pipeline, and the first-token mark's span name. */
const STAGE_ATTR = 'ttft.stage';
const FIRST_TOKEN_SPAN = 'first token';

function loadApi(api) {
  return api === undefined ? require('@opentelemetry/api') : api;
}

/**
 * The caller's first token, marked in the trace where the model's first chunk is not it (the Python
 * `ttft_emit.otel_marks`): a zero-length span `first token` with `ttft.stage = first_token` at `atMs` (default:
 * now, epoch ms), child of `context` (default: the active one). ttft-pipeline takes the request's first token from
 * it. Never throws into the service.
 */
function markFirstToken({ tracerProvider, api, context, atMs } = {}) {
  try {
    api = loadApi(api);
    const at = atMs === undefined ? performance.timeOrigin + performance.now() : atMs;
    const time = [Math.floor(at / 1e3), Math.round((at % 1e3) * 1e6)];
    const tracer = (tracerProvider || api.trace.getTracerProvider()).getTracer('ttft-emit-otel');
    const parent = context === undefined ? api.context.active() : context;
    const span = tracer.startSpan(FIRST_TOKEN_SPAN, { startTime: time, attributes: { [STAGE_ATTR]: 'first_token' } }, parent);
    span.end(time);
  } catch {
    // never into the service
  }
}

/**
 * Whether a streamed item hands the caller text: a non-empty string (the Vercel AI SDK's `textStream`), or a
 * `text-delta` part with non-empty `text` (`ai` 5 and later) or `textDelta` (`ai` 4) (its `fullStream`).
 */
function callerText(item) {
  if (typeof item === 'string') return item.length > 0;
  if (item && typeof item === 'object' && item.type === 'text-delta') {
    const text = item.text !== undefined ? item.text : item.textDelta;
    return typeof text === 'string' && text.length > 0;
  }
  return false;
}

/**
 * `iterable`'s items unchanged, as an async iterable; the first one `isToken` accepts is marked
 * (`markFirstToken`, under the context active when `firstTokenMarked` was called) when it reaches the caller.
 * The Vercel AI SDK 5 times a role-only chunk's empty delta as its first chunk; marking the caller's first text
 * measures what the user waited for:
 *
 *   for await (const text of firstTokenMarked(streamText({...}).textStream)) { ... }
 */
function firstTokenMarked(iterable, { isToken = callerText, tracerProvider, api } = {}) {
  let context;
  try {
    context = loadApi(api).context.active();
  } catch {
    context = undefined;
  }
  return {
    async *[Symbol.asyncIterator]() {
      let marked = false;
      for await (const item of iterable) {
        if (!marked) {
          let accepted = false;
          try {
            accepted = Boolean(isToken(item));
          } catch {
            accepted = false;
          }
          if (accepted) {
            marked = true;
            markFirstToken({ tracerProvider, api, context });
          }
        }
        yield item;
      }
    },
  };
}

module.exports = {
  CLIENT_METHODS,
  FIRST_TOKEN_SPAN,
  STAGE_ATTR,
  callerText,
  firstTokenMarked,
  markFirstToken,
  FIRST_CHUNK_ATTR,
  FirstChunkTiming,
  STREAM_ATTR,
  isLlmSpan,
  isOutput,
  timeFirstChunk,
  timeStream,
};
