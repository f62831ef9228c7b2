#!/usr/bin/env bash
# Installs Debian's kcat (1.7.1 on bookworm) when it is missing, and fails (exit 1) when it cannot: the
# kcat input test produces the pipeline's input with this real, independent Kafka client, so a failed
# install must stop `make test`, never let that test skip. Set TTFT_KCAT_OPTIONAL=1 to turn the failure
# into a warning (exit 0) on a machine that deliberately runs without kcat; that test then fails with the
# reason. How: deploy/debian/install.sh.
TTFT_INSTALL_OPTIONAL="${TTFT_KCAT_OPTIONAL:-0}" exec "$BASH" "${0%/*}/../debian/install.sh" kcat \
  "${TTFT_KCAT_BINARY:-/usr/bin/kcat}" kcat
