#!/usr/bin/env bash
# Installs Debian's prometheus-alertmanager (0.25 on bookworm) when it is missing, and fails (exit 1) when
# it cannot: the alerting tests need the real Alertmanager, so a failed install must stop `make test`, never
# let those tests skip. Set TTFT_ALERTMANAGER_OPTIONAL=1 to turn the failure into a warning (exit 0) on a
# machine that deliberately runs without alerting (`make demo` does); the alerting tests then fail with the
# reason. The package's own service is never left running. How: deploy/debian/install.sh.
TTFT_INSTALL_OPTIONAL="${TTFT_ALERTMANAGER_OPTIONAL:-0}" exec "$BASH" "${0%/*}/../debian/install.sh" prometheus-alertmanager \
  "${TTFT_ALERTMANAGER_BINARY:-/usr/bin/prometheus-alertmanager}" Alertmanager prometheus-alertmanager
