#!/usr/bin/env bash
# Installs Debian's prometheus-alertmanager when it is missing, and fails (exit 1) when it cannot:
# the alerting tests need the real Alertmanager, so a failed install must stop `make test`, never let
# those tests skip. Set TTFT_ALERTMANAGER_OPTIONAL=1 to turn the failure into a warning (exit 0) on a
# machine that deliberately runs without alerting; the alerting tests then fail with the reason.
set -uo pipefail
BINARY="${TTFT_ALERTMANAGER_BINARY:-/usr/bin/prometheus-alertmanager}"
# One line either way: `make demo` runs this with TTFT_ALERTMANAGER_OPTIONAL=1 and goes on without Alertmanager.
fail() {
  if [ "${TTFT_ALERTMANAGER_OPTIONAL:-0}" = 1 ]; then
    echo "prometheus-alertmanager not installed ($*): carrying on without Alertmanager" >&2
    exit 0
  fi
  echo "error: $*" >&2
  exit 1
}
if [ -x "$BINARY" ] || command -v prometheus-alertmanager >/dev/null 2>&1; then exit 0; fi
command -v apt-get >/dev/null 2>&1 || fail "apt-get not found; install prometheus-alertmanager 0.25 by hand"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || fail "not root and no sudo; cannot install prometheus-alertmanager"
  sudo -n apt-get --version >/dev/null 2>&1 || fail "not root and sudo needs a password; cannot install prometheus-alertmanager"
  SUDO="sudo -n"
fi
echo "installing prometheus-alertmanager (Debian package)..."
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d keeps the package from starting a system service: the tests start their own.
CLEAN_POLICY=0
if [ ! -e /usr/sbin/policy-rc.d ] && [ -z "$SUDO" ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && CLEAN_POLICY=1
fi
$SUDO apt-get update -qq >/dev/null 2>&1 || echo "warning: apt-get update failed" >&2
$SUDO apt-get install -y -qq prometheus-alertmanager >/dev/null 2>&1
rc=$?
if [ "$CLEAN_POLICY" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
[ "$rc" -eq 0 ] || fail "apt-get install prometheus-alertmanager failed (exit $rc)"
[ -x "$BINARY" ] || fail "$BINARY missing after the install"
# A service the package started anyway (no policy-rc.d of ours) is stopped through its init script,
# never by a process-name match that could hit another user's Alertmanager.
if [ "$CLEAN_POLICY" = 0 ] && command -v service >/dev/null 2>&1; then
  $SUDO service prometheus-alertmanager stop >/dev/null 2>&1 || true
fi
exit 0
