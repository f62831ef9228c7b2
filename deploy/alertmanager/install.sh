#!/usr/bin/env bash
# Installs Debian's prometheus-alertmanager when it is missing. Without apt (or root) it warns and carries on:
# the tests that need Alertmanager then skip with that reason.
set -uo pipefail
if command -v prometheus-alertmanager >/dev/null 2>&1; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "warning: apt-get not found; prometheus-alertmanager not installed (alerting e2e tests will skip)" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
    echo "warning: not root and no sudo; prometheus-alertmanager not installed" >&2; exit 0; fi
fi
echo "installing prometheus-alertmanager (Debian package)..."
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d keeps the package from starting a system service: the tests start their own.
if [ ! -e /usr/sbin/policy-rc.d ] && [ -z "$SUDO" ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && CLEAN_POLICY=1
fi
$SUDO apt-get update -qq >/dev/null 2>&1 || echo "warning: apt-get update failed" >&2
if ! $SUDO apt-get install -y -qq prometheus-alertmanager >/dev/null 2>&1; then
  echo "warning: apt-get install prometheus-alertmanager failed; alerting e2e tests will skip" >&2
fi
if [ "${CLEAN_POLICY:-0}" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
pkill -f '^/usr/bin/prometheus-alertmanager' >/dev/null 2>&1 || true
exit 0
