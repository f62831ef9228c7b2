package ttft;

import io.micrometer.observation.ObservationRegistry;
import io.opentelemetry.api.OpenTelemetry;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanKind;
import io.opentelemetry.api.trace.Tracer;
import io.opentelemetry.context.Context;
import io.opentelemetry.context.Scope;
import io.opentelemetry.sdk.common.Clock;
import io.opentelemetry.sdk.testing.exporter.InMemorySpanExporter;
import io.opentelemetry.sdk.trace.SdkTracerProvider;
import io.opentelemetry.sdk.trace.SpanProcessor;
import io.opentelemetry.sdk.trace.export.SimpleSpanProcessor;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.springframework.ai.chat.client.ChatClient;
import org.springframework.ai.chat.client.advisor.vectorstore.QuestionAnswerAdvisor;
import org.springframework.ai.document.Document;
import org.springframework.ai.embedding.EmbeddingModel;
import org.springframework.ai.vectorstore.SimpleVectorStore;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.context.annotation.Bean;

/**
 * A Spring AI RAG service traced by Spring's own observability: Spring Boot 4's OpenTelemetry starter (Micrometer
 * Tracing's OpenTelemetry bridge, every request sampled) and Spring AI 2.0's observations of its ChatClient, its
 * advisors, its vector store and its OpenAI chat and embedding models, against the OpenAI stub of ../capture.py
 * (first chunk 120 ms after the request, the rest 30 ms apart; a plain answer after 150 ms). Run through
 * ../capture_java.py --project java_spring_ai, which starts the stub and passes its URL.
 *
 * <p>A SimpleVectorStore holds three documents (embedded through the stub); a ChatClient with a
 * QuestionAnswerAdvisor on it retrieves before each call. Three requests, each a trace under a root span "POST /ask"
 * (SERVER) the service makes with the OpenTelemetry API: stream (ChatClient's stream().content(), a Flux the
 * service consumes), non_stream (call().content()) and stream2. One untraced warm-up of each kind first.
 *
 * <p>With {@code spring.reactor.context-propagation=auto} (Spring Boot's switch for Reactor's automatic context
 * propagation): without it a stream's observations leave the request's trace (its chat span was a trace of its
 * own, the advisor spans gone). A SimpleVectorStore is observed only when built with the ObservationRegistry.
 *
 * <p>Set-ups: {@code spring_ai}: as above; {@code spring_ai_marked}: the service also marks its caller's first
 * text with a zero-length child span "first token", ttft.stage = first_token (the Flux runs on Reactor's threads:
 * the mark gets the request's Context as its parent).
 *
 * <p>{@code spring_ai_noprop}: as {@code spring_ai}, with Reactor's context propagation left at Boot's default.
 *
 * <p>The same source runs Spring AI 1.1 on Spring Boot 3.5 (../java_spring_ai11/pom.xml, set-ups {@code spring_ai11},
 * {@code spring_ai11_marked}): there the OpenTelemetry SDK is Boot's actuator's, under Micrometer Tracing's bridge.
 *
 * <p>Writes OUT/PREFIX_SETUP.otlp and .json (../java_common/ttft/CaptureFiles.java), PREFIX the system property
 * ttft.capture.prefix (its pom's), else java_spring_ai.
 */
@SpringBootApplication
public class SpringAiCapture {
  static final String QUESTION = "What is the capital of France?";
  static final Clock CLOCK = Clock.getDefault();
  static final InMemorySpanExporter EXPORTER = InMemorySpanExporter.create();

  /** The spans, as they end, into memory (Boot adds every SpanProcessor bean to its tracer provider). */
  @Bean
  SpanProcessor captureSpans() {
    return SimpleSpanProcessor.create(EXPORTER);
  }

  public static void main(String[] args) throws Exception {
    String baseUrl = null;
    String out = null;
    String setup = "spring_ai";
    for (int i = 0; i < args.length; i += 2) {
      switch (args[i]) {
        case "--base-url" -> baseUrl = args[i + 1];
        case "--out" -> out = args[i + 1];
        case "--setup" -> setup = args[i + 1];
        default -> throw new IllegalArgumentException("unknown argument " + args[i]);
      }
    }
    if (baseUrl == null || out == null || !setup.startsWith("spring_ai")) {
      throw new IllegalArgumentException("usage: --base-url URL --out DIR [--setup spring_ai[11][_marked]]");
    }
    ConfigurableApplicationContext app =
        new SpringApplicationBuilder(SpringAiCapture.class)
            .web(WebApplicationType.NONE)
            .properties(
                "spring.ai.openai.base-url=" + baseUrl,
                "spring.ai.openai.api-key=stub-key",
                "spring.ai.openai.max-retries=0",
                "spring.ai.openai.chat.model=gpt-4o-mini",
                "spring.ai.openai.embedding.model=text-embedding-3-small",
                "spring.application.name=rag-api-java",
                "management.tracing.sampling.probability=1.0",
                "management.opentelemetry.resource-attributes.tenant.id=acme",
                "management.otlp.tracing.export.enabled=false",
                "management.otlp.metrics.export.enabled=false",
                // Set-up spring_ai_noprop: Reactor's default (limited), as a service that never set it.
                "spring.reactor.context-propagation=" + (setup.contains("noprop") ? "limited" : "auto"),
                "logging.level.root=WARN")
            .run();
    EmbeddingModel embeddings = app.getBean(EmbeddingModel.class);
    ObservationRegistry registry = app.getBean(ObservationRegistry.class);
    SimpleVectorStore store = SimpleVectorStore.builder(embeddings).observationRegistry(registry).build();
    for (String text :
        List.of(
            "Paris is the capital of France.",
            "Berlin is the capital of Germany.",
            "Madrid is the capital of Spain.")) {
      store.add(List.of(new Document(text))); // one at a time: the stub embeds one input per call
    }
    ChatClient chat =
        app.getBean(ChatClient.Builder.class).defaultAdvisors(QuestionAnswerAdvisor.builder(store).build()).build();
    Tracer tracer = app.getBean(OpenTelemetry.class).getTracer("rag-api");
    boolean marked = setup.endsWith("_marked");
    chat.prompt().user(QUESTION).call().content(); // warm-up (traced too: dropped below)
    chat.prompt().user(QUESTION).stream().content().blockLast();
    SdkTracerProvider provider = app.getBean(SdkTracerProvider.class);
    provider.forceFlush().join(10, TimeUnit.SECONDS);
    EXPORTER.reset();
    List<Map<String, Object>> traces = new ArrayList<>();
    for (String c : List.of("stream", "non_stream", "stream2")) {
      traces.add(ask(chat, tracer, c, marked));
    }
    // A stream's chat span ends when its Flux completes, up to some ms after the caller's blockLast returned (and
    // after the root at times): exported in end order, as the Collector would get them.
    Thread.sleep(1_000);
    provider.forceFlush().join(10, TimeUnit.SECONDS);
    CaptureFiles.write(
        out,
        System.getProperty("ttft.capture.prefix", "java_spring_ai") + "_" + setup,
        EXPORTER.getFinishedSpanItems(),
        traces,
        "\"spring\": " + CaptureFiles.quoted(System.getProperty("ttft.versions", "?")));
    app.close();
    System.exit(0);
  }

  static Map<String, Object> ask(ChatClient chat, Tracer tracer, String caseName, boolean marked) {
    boolean streaming = !caseName.equals("non_stream");
    Span root = tracer.spanBuilder("POST /ask").setSpanKind(SpanKind.SERVER).startSpan();
    AtomicLong first = new AtomicLong();
    long called;
    long answered;
    try (Scope ignored = root.makeCurrent()) {
      Context request = Context.current();
      called = CLOCK.now();
      if (streaming) {
        chat.prompt()
            .user(QUESTION)
            .stream()
            .content()
            .doOnNext(text -> {
              if (!text.isEmpty()) {
                firstText(first, tracer, request, marked);
              }
            })
            .blockLast();
      } else {
        chat.prompt().user(QUESTION).call().content();
        firstText(first, tracer, request, marked);
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

  static void firstText(AtomicLong first, Tracer tracer, Context request, boolean marked) {
    if (first.get() != 0) {
      return;
    }
    long at = CLOCK.now();
    first.set(at);
    if (marked) {
      tracer
          .spanBuilder("first token")
          .setParent(request)
          .setStartTimestamp(at, TimeUnit.NANOSECONDS)
          .setAttribute("ttft.stage", "first_token")
          .startSpan()
          .end(at, TimeUnit.NANOSECONDS);
    }
  }
}
