#!/usr/bin/env bash
# Installs Debian's prometheus package (2.42 on bookworm) when promtool is missing, and fails (exit 1) when
# it cannot: the suite runs deploy/prometheus/ttft-rules.test.yaml through promtool, Prometheus's own rule
# engine, so a failed install must stop `make test`, never let that test skip. Only promtool is used; the
# package's server is never left running. Set TTFT_PROMTOOL_OPTIONAL=1 to turn the failure into a warning
# (exit 0); that test then fails with the reason. How: deploy/debian/install.sh.
TTFT_INSTALL_OPTIONAL="${TTFT_PROMTOOL_OPTIONAL:-0}" exec "$BASH" "${0%/*}/../debian/install.sh" prometheus \
  "${TTFT_PROMTOOL_BINARY:-/usr/bin/promtool}" promtool prometheus
