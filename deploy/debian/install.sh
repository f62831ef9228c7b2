#!/usr/bin/env bash
# Installs one Debian package when its binary is missing, and fails (exit 1) when it cannot, so that a
# failed install stops `make test` instead of letting the tests that need the real tool skip. Used by
# deploy/alertmanager/install.sh, deploy/kcat/install.sh and deploy/prometheus/install.sh:
#
#   install.sh PACKAGE BINARY LABEL [SERVICE]
#
# LABEL names the tool in the one-line message; SERVICE is the system service the package would start
# (kept from starting with policy-rc.d when root, stopped through its init script otherwise: the tests
# start their own). TTFT_INSTALL_OPTIONAL=1 turns a failure into that one line and exit 0 (`make demo`).
set -uo pipefail
PACKAGE="$1" BINARY="$2" LABEL="$3" SERVICE="${4:-}"
fail() {
  if [ "${TTFT_INSTALL_OPTIONAL:-0}" = 1 ]; then
    echo "$PACKAGE not installed ($*): carrying on without $LABEL" >&2
    exit 0
  fi
  echo "error: $*" >&2
  exit 1
}
if [ -x "$BINARY" ] || command -v "${BINARY##*/}" >/dev/null 2>&1; then exit 0; fi
command -v apt-get >/dev/null 2>&1 || fail "apt-get not found; install $PACKAGE by hand"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || fail "not root and no sudo; cannot install $PACKAGE"
  sudo -n apt-get --version >/dev/null 2>&1 || fail "not root and sudo needs a password; cannot install $PACKAGE"
  SUDO="sudo -n"
fi
echo "installing $PACKAGE (Debian package)..."
export DEBIAN_FRONTEND=noninteractive
CLEAN_POLICY=0
if [ -n "$SERVICE" ] && [ ! -e /usr/sbin/policy-rc.d ] && [ -z "$SUDO" ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && CLEAN_POLICY=1
fi
$SUDO apt-get update -qq >/dev/null 2>&1 || echo "warning: apt-get update failed" >&2
$SUDO apt-get install -y -qq "$PACKAGE" >/dev/null 2>&1
rc=$?
if [ "$CLEAN_POLICY" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
[ "$rc" -eq 0 ] || fail "apt-get install $PACKAGE failed (exit $rc)"
[ -x "$BINARY" ] || command -v "${BINARY##*/}" >/dev/null 2>&1 || fail "$BINARY missing after the install"
# A service the package started anyway (no policy-rc.d of ours) is stopped through its init script,
# never by a process-name match that could hit another user's process.
if [ -n "$SERVICE" ] && [ "$CLEAN_POLICY" = 0 ] && command -v service >/dev/null 2>&1; then
  $SUDO service "$SERVICE" stop >/dev/null 2>&1 || true
fi
exit 0
