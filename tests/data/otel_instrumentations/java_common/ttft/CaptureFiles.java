package ttft;

import io.opentelemetry.exporter.internal.otlp.traces.TraceRequestMarshaler;
import io.opentelemetry.sdk.trace.data.SpanData;
import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * A Java capture's files, as ../capture.py writes them: NAME.otlp (per trace a 4-byte big-endian length and the
 * ExportTraceServiceRequest the OTLP exporters' own marshaler makes: the requests' traces in their order, then any
 * other trace; not written when the spans are null, exported elsewhere) and NAME.json (the versions, the tenant, "other_traces" and what the service saw per request).
 * Shared by java_openai/ and java_spring_ai/ (each adds this folder to its sources).
 */
final class CaptureFiles {
  private CaptureFiles() {}

  static void write(
      String out, String name, List<SpanData> spans, List<Map<String, Object>> traces, String versions)
      throws IOException {
    List<String> traceIds = new ArrayList<>();
    for (Map<String, Object> t : traces) {
      traceIds.add((String) t.get("trace_id"));
    }
    List<String> others = new ArrayList<>();
    if (spans == null) { // exported elsewhere (the agent set-ups): what the service saw only
      writeJson(out, name, traces, versions, others);
      return;
    }
    for (SpanData s : spans) {
      if (!traceIds.contains(s.getTraceId()) && !others.contains(s.getTraceId())) {
        others.add(s.getTraceId());
      }
    }
    List<String> all = new ArrayList<>(traceIds);
    all.addAll(others);
    try (DataOutputStream f = new DataOutputStream(new FileOutputStream(Path.of(out, name + ".otlp").toFile()))) {
      for (String traceId : all) {
        List<SpanData> mine = new ArrayList<>();
        for (SpanData s : spans) {
          if (s.getTraceId().equals(traceId)) {
            mine.add(s);
          }
        }
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        TraceRequestMarshaler.create(mine).writeBinaryTo(buf);
        f.writeInt(buf.size());
        buf.writeTo(f);
      }
    }
    writeJson(out, name, traces, versions, others);
    for (SpanData s : spans) {
      System.out.printf(
          "%s %-40s %8.1f ms %s%n",
          s.getTraceId().substring(0, 8),
          s.getName(),
          (s.getEndEpochNanos() - s.getStartEpochNanos()) / 1e6,
          s.getInstrumentationScopeInfo().getName());
    }
  }

  static void writeJson(
      String out, String name, List<Map<String, Object>> traces, String versions, List<String> others)
      throws IOException {
    StringBuilder json = new StringBuilder();
    json.append("{\n \"library\": ").append(quoted(name)).append(",\n \"versions\": {").append(versions)
        .append(", \"java\": ").append(quoted(System.getProperty("java.version"))).append("},\n")
        .append(" \"tenant\": \"acme\",\n \"other_traces\": [");
    for (int i = 0; i < others.size(); i++) {
      json.append(i == 0 ? "" : ", ").append(quoted(others.get(i)));
    }
    json.append("],\n \"traces\": [");
    for (int i = 0; i < traces.size(); i++) {
      json.append(i == 0 ? "\n  {" : ",\n  {");
      int k = 0;
      for (Map.Entry<String, Object> e : traces.get(i).entrySet()) {
        Object v = e.getValue();
        String value = v == null ? "null" : v instanceof String s ? quoted(s) : v.toString();
        json.append(k++ == 0 ? "" : ", ").append(quoted(e.getKey())).append(": ").append(value);
      }
      json.append('}');
    }
    json.append("\n ]\n}\n");
    Files.writeString(Path.of(out, name + ".json"), json.toString(), StandardCharsets.UTF_8);
  }

  static String quoted(String s) {
    return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
  }
}
