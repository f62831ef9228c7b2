#!/usr/bin/env bash
# Installs Debian's kcat (1.7.1 on bookworm) when it is missing, and fails (exit 1) when it cannot: the
# kcat input test produces the pipeline's input with this real, independent Kafka client, so a failed
# install must stop `make test`, never let that test skip. Set TTFT_KCAT_OPTIONAL=1 to turn the failure
# into a warning (exit 0) on a machine that deliberately runs without kcat; that test then fails with the
# reason.
set -uo pipefail
BINARY="${TTFT_KCAT_BINARY:-/usr/bin/kcat}"
# One line either way: `make demo` runs this with TTFT_KCAT_OPTIONAL=1 and goes on without kcat.
fail() {
  if [ "${TTFT_KCAT_OPTIONAL:-0}" = 1 ]; then
    echo "kcat not installed ($*): carrying on without kcat" >&2
    exit 0
  fi
  echo "error: $*" >&2
  exit 1
}
if [ -x "$BINARY" ] || command -v kcat >/dev/null 2>&1; then exit 0; fi
command -v apt-get >/dev/null 2>&1 || fail "apt-get not found; install kcat 1.7 by hand"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || fail "not root and no sudo; cannot install kcat"
  sudo -n apt-get --version >/dev/null 2>&1 || fail "not root and sudo needs a password; cannot install kcat"
  SUDO="sudo -n"
fi
echo "installing kcat (Debian package)..."
export DEBIAN_FRONTEND=noninteractive
# kcat ships no service, so no policy-rc.d is needed (unlike deploy/alertmanager/install.sh).
$SUDO apt-get update -qq >/dev/null 2>&1 || echo "warning: apt-get update failed" >&2
$SUDO apt-get install -y -qq kcat >/dev/null 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "apt-get install kcat failed (exit $rc)"
[ -x "$BINARY" ] || command -v kcat >/dev/null 2>&1 || fail "$BINARY missing after the install"
exit 0
