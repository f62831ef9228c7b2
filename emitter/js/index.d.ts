export declare const FIRST_CHUNK_ATTR: 'gen_ai.response.time_to_first_chunk';
export declare const STREAM_ATTR: 'gen_ai.request.stream';
export declare const CLIENT_METHODS: string[][];

export interface FirstChunkStats {
  calls: number;
  spans: number;
  firstChunks: number;
  unmatched: number;
  errors: number;
  filled: number;
}

export interface SpanProcessorLike {
  onStart(span: unknown, parentContext?: unknown): void;
  onEnd(span: unknown): void;
  forceFlush(): Promise<void>;
  shutdown(): Promise<void>;
}

export declare class FirstChunkTiming {
  constructor(options?: { fillMissing?: boolean; tracerProvider?: unknown; api?: unknown });
  readonly stats: FirstChunkStats;
  spanProcessor(): SpanProcessorLike;
  fillMissingSpans(tracerProvider?: unknown, api?: unknown): void;
  instrument<T>(client: T): T;
  wrap<F extends (...args: any[]) => any>(create: F): F;
}

export declare function timeFirstChunk(
  client: unknown,
  options: { tracerProvider: unknown; fillMissing?: boolean; api?: unknown },
): FirstChunkTiming;
export declare function isLlmSpan(attributes: Record<string, unknown> | undefined): boolean;
export declare function isOutput(chunk: unknown): boolean;
export declare function timeStream<S>(stream: S, onFirst: () => void, onEnd: () => void): S;

export declare const STAGE_ATTR: 'ttft.stage';
export declare const FIRST_TOKEN_SPAN: 'first token';
export declare function markFirstToken(options?: {
  tracerProvider?: unknown;
  api?: unknown;
  context?: unknown;
  atMs?: number;
}): void;
export declare function callerText(item: unknown): boolean;
export declare function firstTokenMarked<T>(
  iterable: AsyncIterable<T> | Iterable<T>,
  options?: { isToken?: (item: T) => boolean; tracerProvider?: unknown; api?: unknown },
): AsyncIterable<T>;
