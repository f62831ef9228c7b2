"""The OpenTelemetry Collector that feeds spans into the pipeline (``ttft otel up/down``)."""
