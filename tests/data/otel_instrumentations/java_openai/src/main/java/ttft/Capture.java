package ttft;

import com.openai.client.OpenAIClient;
import com.openai.client.OpenAIClientAsync;
import com.openai.client.okhttp.OpenAIOkHttpClient;
import com.openai.client.okhttp.OpenAIOkHttpClientAsync;
import com.openai.core.http.AsyncStreamResponse;
import com.openai.core.http.StreamResponse;
import com.openai.models.chat.completions.ChatCompletionChunk;
import com.openai.models.chat.completions.ChatCompletionCreateParams;
import com.openai.models.chat.completions.ChatCompletionStreamOptions;
import com.openai.models.embeddings.EmbeddingCreateParams;
import io.opentelemetry.api.GlobalOpenTelemetry;
import io.opentelemetry.api.common.AttributeKey;
import io.opentelemetry.api.common.Attributes;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanKind;
import io.opentelemetry.api.trace.Tracer;
import io.opentelemetry.context.Context;
import io.opentelemetry.context.Scope;
import io.opentelemetry.instrumentation.openai.v1_1.OpenAITelemetry;
import io.opentelemetry.sdk.OpenTelemetrySdk;
import io.opentelemetry.sdk.common.Clock;
import io.opentelemetry.sdk.resources.Resource;
import io.opentelemetry.sdk.testing.exporter.InMemorySpanExporter;
import io.opentelemetry.sdk.trace.SdkTracerProvider;
import io.opentelemetry.sdk.trace.data.SpanData;
import io.opentelemetry.sdk.trace.export.SimpleSpanProcessor;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A small RAG service in Java: the openai-java client (OkHttp) wrapped by OpenTelemetry's own library
 * instrumentation (opentelemetry-openai-java-1.1, {@code OpenAITelemetry.create(otel).wrap(client)}), against the
 * OpenAI stub of ../capture.py (first chunk 120 ms after the request, the rest 30 ms apart; a plain answer after
 * 150 ms). Run through ../capture_java.py, which starts the stub and passes its URL.
 *
 * <p>Four requests, each a trace under a root span "POST /ask" (SERVER): a retrieval span of the GenAI convention
 * ("retrieval docs", gen_ai.operation.name = retrieval) around an embeddings call and 20 ms of vector search,
 * 25 ms of prompt work, then the chat call: stream (createStreaming, include_usage), non_stream (create),
 * stream_async (the async client's createStreaming, subscribe, onCompleteFuture) and stream2 (a second stream).
 * One untraced warm-up call of each kind first.
 *
 * <p>Set-ups: {@code otel}: as above; {@code otel_marked}: the same, and the service marks its first token with
 * the plain OpenTelemetry API (a zero-length child span "first token" with ttft.stage = first_token when the
 * first chunk with text arrives, or the plain answer returns), as docs/otlp-mapping.md asks of a service with no
 * ttft-emit helper; its async stream's callback (OkHttp's thread) hands the mark the request's Context. A fifth
 * case, stream_async_lost, does not: the mark is a trace of its own (listed under "other_traces").
 *
 * <p>{@code agent}, {@code agent_marked}: the same four requests (the marked one with the mark's parent set) under
 * OpenTelemetry's Java agent instead of the library instrumentation ({@link #underAgent}).
 *
 * <p>Writes OUT/java_openai_SETUP.otlp (4-byte big-endian length + ExportTraceServiceRequest per trace, the OTLP
 * exporter's own marshaler) and OUT/java_openai_SETUP.json (truth per trace: called_ns just before the call,
 * first_chunk_ns when the caller got its first text, answered_ns; epoch ns on the SDK's clock).
 */
public final class Capture {
  static final String MODEL = "gpt-4o-mini";
  static final String EMBEDDING_MODEL = "text-embedding-3-small";
  static final String QUESTION = "What is the capital of France?";
  static final Clock CLOCK = Clock.getDefault();

  final Tracer tracer;
  final OpenAIClient client;
  final OpenAIClientAsync asyncClient;
  final boolean marked;

  Capture(Tracer tracer, OpenAIClient client, OpenAIClientAsync asyncClient, boolean marked) {
    this.tracer = tracer;
    this.client = client;
    this.asyncClient = asyncClient;
    this.marked = marked;
  }

  static ChatCompletionCreateParams params(boolean stream) {
    ChatCompletionCreateParams.Builder b =
        ChatCompletionCreateParams.builder().model(MODEL).addUserMessage(QUESTION);
    if (stream) {
      b.streamOptions(ChatCompletionStreamOptions.builder().includeUsage(true).build());
    }
    return b.build();
  }

  static boolean hasText(ChatCompletionChunk chunk) {
    return chunk.choices().stream()
        .anyMatch(c -> c.delta().content().map(s -> !s.isEmpty()).orElse(false));
  }

  /**
   * The caller's first text: its time, and (otel_marked) the service's own first-token span, child of {@code parent}
   * (null: of the current context, which an async callback does not have).
   */
  void firstText(AtomicLong first, Context parent) {
    if (first.get() != 0) {
      return;
    }
    long at = CLOCK.now();
    first.set(at);
    if (marked) {
      var builder = tracer.spanBuilder("first token");
      if (parent != null) {
        builder.setParent(parent);
      }
      Span mark =
          builder
              .setStartTimestamp(at, TimeUnit.NANOSECONDS)
              .setAttribute("ttft.stage", "first_token")
              .startSpan();
      mark.end(at, TimeUnit.NANOSECONDS);
    }
  }

  void retrieve() throws InterruptedException {
    Span span =
        tracer
            .spanBuilder("retrieval docs")
            .setSpanKind(SpanKind.CLIENT)
            .setAttribute("gen_ai.operation.name", "retrieval")
            .setAttribute("gen_ai.data_source.id", "docs")
            .startSpan();
    try (Scope ignored = span.makeCurrent()) {
      client.embeddings().create(EmbeddingCreateParams.builder().model(EMBEDDING_MODEL).input(QUESTION).build());
      Thread.sleep(20);
    } finally {
      span.end();
    }
  }

  Map<String, Object> ask(String caseName) throws Exception {
    boolean streaming = !caseName.equals("non_stream");
    Span root = tracer.spanBuilder("POST /ask").setSpanKind(SpanKind.SERVER).startSpan();
    long called;
    AtomicLong first = new AtomicLong();
    long answered;
    try (Scope ignored = root.makeCurrent()) {
      retrieve();
      Thread.sleep(25);
      called = CLOCK.now();
      if (caseName.startsWith("stream_async")) {
        // The callback runs on OkHttp's thread, outside this context: stream_async hands the mark its parent,
        // stream_async_lost does not (the service's mistake: its mark becomes a trace of its own).
        Context parent = caseName.equals("stream_async") ? Context.current() : null;
        AsyncStreamResponse<ChatCompletionChunk> stream =
            asyncClient.chat().completions().createStreaming(params(true));
        stream.subscribe(chunk -> {
          if (hasText(chunk)) {
            firstText(first, parent);
          }
        });
        stream.onCompleteFuture().get(30, TimeUnit.SECONDS);
      } else if (streaming) {
        try (StreamResponse<ChatCompletionChunk> stream = client.chat().completions().createStreaming(params(true))) {
          stream.stream().forEach(chunk -> {
            if (hasText(chunk)) {
              firstText(first, null);
            }
          });
        }
      } else {
        client.chat().completions().create(params(false));
        firstText(first, null); // the answer, all at once
      }
      answered = CLOCK.now();
    } finally {
      root.end();
    }
    Map<String, Object> truth = new LinkedHashMap<>();
    truth.put("case", caseName);
    truth.put("trace_id", root.getSpanContext().getTraceId());
    truth.put("streaming", streaming);
    truth.put("called_ns", called);
    truth.put("first_chunk_ns", first.get());
    truth.put("answered_ns", answered);
    return truth;
  }

  static void warmUp(OpenAIClient plain, OpenAIClientAsync plainAsync) throws Exception {
    plain.embeddings().create(EmbeddingCreateParams.builder().model(EMBEDDING_MODEL).input(QUESTION).build());
    plain.chat().completions().create(params(false));
    try (StreamResponse<ChatCompletionChunk> s = plain.chat().completions().createStreaming(params(true))) {
      s.stream().forEach(c -> {});
    }
    AsyncStreamResponse<ChatCompletionChunk> a = plainAsync.chat().completions().createStreaming(params(true));
    a.subscribe(c -> {});
    a.onCompleteFuture().get(30, TimeUnit.SECONDS);
  }

  /**
   * The agent set-ups: the JVM runs with OpenTelemetry's Java agent (-javaagent, its openai-java instrumentation
   * applied when a client is built), which exports over OTLP/HTTP to ../capture_java.py's receiver; the service
   * uses GlobalOpenTelemetry and writes only what it saw (the receiver writes the spans). No warm-up: every call
   * would be a trace.
   */
  static void underAgent(String baseUrl, String out, String setup) throws Exception {
    Capture service =
        new Capture(
            GlobalOpenTelemetry.get().getTracer("rag-api"),
            OpenAIOkHttpClient.builder().baseUrl(baseUrl).apiKey("stub-key").maxRetries(0).build(),
            OpenAIOkHttpClientAsync.builder().baseUrl(baseUrl).apiKey("stub-key").maxRetries(0).build(),
            setup.equals("agent_marked"));
    List<Map<String, Object>> traces = new ArrayList<>();
    for (String c : List.of("stream", "non_stream", "stream_async", "stream2")) {
      traces.add(service.ask(c));
    }
    String versions =
        "\"com.openai:openai-java\": " + CaptureFiles.quoted(System.getProperty("ttft.openai.version", "?"))
            + ", \"io.opentelemetry.javaagent:opentelemetry-javaagent\": "
            + CaptureFiles.quoted(System.getProperty("ttft.agent.version", "?"));
    CaptureFiles.write(out, "java_openai_" + setup, null, traces, versions);
    System.exit(0); // the agent's shutdown hook exports what is left
  }

  public static void main(String[] args) throws Exception {
    String baseUrl = null;
    String out = null;
    String setup = "otel";
    for (int i = 0; i < args.length; i += 2) {
      switch (args[i]) {
        case "--base-url" -> baseUrl = args[i + 1];
        case "--out" -> out = args[i + 1];
        case "--setup" -> setup = args[i + 1];
        default -> throw new IllegalArgumentException("unknown argument " + args[i]);
      }
    }
    if (baseUrl == null || out == null || !List.of("otel", "otel_marked", "agent", "agent_marked").contains(setup)) {
      throw new IllegalArgumentException("usage: --base-url URL --out DIR [--setup otel|otel_marked|agent|agent_marked]");
    }
    if (setup.startsWith("agent")) {
      underAgent(baseUrl, out, setup);
      return;
    }
    InMemorySpanExporter exporter = InMemorySpanExporter.create();
    Resource resource =
        Resource.getDefault()
            .merge(
                Resource.create(
                    Attributes.of(
                        AttributeKey.stringKey("service.name"), "rag-api-java",
                        AttributeKey.stringKey("tenant.id"), "acme")));
    SdkTracerProvider provider =
        SdkTracerProvider.builder()
            .setResource(resource)
            .addSpanProcessor(SimpleSpanProcessor.create(exporter))
            .build();
    OpenTelemetrySdk otel = OpenTelemetrySdk.builder().setTracerProvider(provider).build();
    OpenAIClient plain = OpenAIOkHttpClient.builder().baseUrl(baseUrl).apiKey("stub-key").maxRetries(0).build();
    OpenAIClientAsync plainAsync =
        OpenAIOkHttpClientAsync.builder().baseUrl(baseUrl).apiKey("stub-key").maxRetries(0).build();
    warmUp(plain, plainAsync);
    OpenAITelemetry telemetry = OpenAITelemetry.create(otel);
    Capture service =
        new Capture(
            otel.getTracer("rag-api"), telemetry.wrap(plain), telemetry.wrap(plainAsync), setup.equals("otel_marked"));
    List<Map<String, Object>> traces = new ArrayList<>();
    List<String> cases = new ArrayList<>(List.of("stream", "non_stream", "stream_async", "stream2"));
    if (service.marked) {
      cases.add("stream_async_lost");
    }
    for (String c : cases) {
      traces.add(service.ask(c));
    }
    provider.forceFlush().join(10, TimeUnit.SECONDS);
    List<SpanData> spans = exporter.getFinishedSpanItems();
    String name = "java_openai_" + setup;
    String versions =
        "\"com.openai:openai-java\": " + CaptureFiles.quoted(System.getProperty("ttft.openai.version", "?"))
            + ", \"io.opentelemetry.instrumentation:opentelemetry-openai-java-1.1\": "
            + CaptureFiles.quoted(System.getProperty("ttft.otel.instrumentation.version", "?"))
            + ", \"io.opentelemetry:opentelemetry-sdk\": "
            + CaptureFiles.quoted(System.getProperty("ttft.otel.version", "?"));
    CaptureFiles.write(out, name, spans, traces, versions);
    provider.shutdown().join(10, TimeUnit.SECONDS);
    System.exit(0);
  }
}
