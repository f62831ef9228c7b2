#!/usr/bin/env bash
# Build otelcol-ttft, the project's OpenTelemetry Collector, from deploy/otel/builder-config.yaml with the
# OpenTelemetry Collector Builder, into .cache/otel/otelcol-ttft (run by `make otelcol`, which caches the
# result by a stamp keyed on the manifest's hash).
# The builder lands in .cache/otel/bin; Go's module and build caches stay at the user defaults
# (GOMODCACHE, GOCACHE) so that every clone on the machine reuses them: a cold build takes ~6 minutes and
# ~3 GB there, a warm one seconds. Any failure exits non-zero with the builder's own output: never skipped.
set -euo pipefail

builder_version="v0.165.0"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$root/.cache/otel"
manifest="$root/deploy/otel/builder-config.yaml"

# The machine's Go lives in /usr/local/go; a shell that has not put it on PATH still builds.
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
command -v go >/dev/null || { echo "otelcol build: go is not installed (Go 1.26+ needed)" >&2; exit 1; }

trap 'echo "otelcol build: FAILED (the error is above); no binary was installed" >&2' ERR

mkdir -p "$out/bin"
export GOBIN="$out/bin"
start=$(date +%s)
echo "otelcol build: installing the Collector Builder $builder_version ($(go version))"
go install "go.opentelemetry.io/collector/cmd/builder@$builder_version"

echo "otelcol build: building otelcol-ttft from deploy/otel/builder-config.yaml" \
  "(a cold Go cache takes ~6 minutes and ~3 GB)..."
rm -f "$out/otelcol-ttft"
# output_path in the manifest is relative to the repository root.
(cd "$root" && "$GOBIN/builder" --config "$manifest")
install -m 0755 "$out/src/otelcol-ttft" "$out/otelcol-ttft"
"$out/otelcol-ttft" --version
echo "otelcol build: $out/otelcol-ttft ready in $(( $(date +%s) - start )) s"
