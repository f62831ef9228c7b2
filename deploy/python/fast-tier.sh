#!/usr/bin/env bash
# The fast test tier on another supported Python (issue 29): `deploy/python/fast-tier.sh 3.12 "<markers>"`.
# Its own venv (.venv-<version>, reinstalled when pyproject.toml changes) and its own mypyc build of the
# join's core (.cache/native-<version>; a failed build is reported and the tier fails on it).
set -euo pipefail
version=$1
markers=$2
cd "$(dirname "$0")/../.."

find_python() {
    local candidate
    for candidate in "python$version" "$(pyenv root 2>/dev/null)/versions/$version"*/bin/"python$version" \
        /usr/bin/"python$version" /usr/local/bin/"python$version"; do
        if "$candidate" -c 'import sys' >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

python=$(find_python) || {
    echo "fast tier on Python $version: no python$version interpreter found (pyenv install $version, or apt)" >&2
    exit 1
}
venv=".venv-$version"
stamp="$venv/.installed-$(cat pyproject.toml emitter/pyproject.toml | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    echo "fast tier on Python $version: installing into $venv ($python)"
    test -x "$venv/bin/python" || "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -e ./emitter -e '.[dev]'
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
export TTFT_NATIVE_ROOT="$PWD/.cache/native-$version"
"$venv/bin/python" -m streams.native_build --if-stale
echo "fast tier on $("$venv/bin/python" -V)"
exec "$venv/bin/python" -m pytest -m "$markers" -q -p no:cacheprovider --durations=5
