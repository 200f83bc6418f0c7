#!/usr/bin/env bash
# Install Triton's perf_analyzer into .venv-pa/ (or $PERF_ANALYZER_VENV) and print where it is.
# Idempotent: a second run checks and changes nothing. Why this recipe: docs/perf-analyzer.md.
#
#   bash scripts/install-perf-analyzer.sh
#   scripts/perf_analyzer -m all-MiniLM-L6-v2 -u 127.0.0.1:8000 ...   # the wrapper to run it with
#
# - The binary ships in the tritonclient wheels; 2.51.0 (manylinux1, GLIBC >= 2.34) is the
#   last whose binary runs on Debian 12 (glibc 2.36). PyPI's perf-analyzer installs a
#   placeholder here (its real wheels are manylinux_2_38).
# - It links libb64.so.0d (Debian libb64-0d: installed with apt-get when absent, as root) and
#   libcudart.so.12 (PyPI nvidia-cuda-runtime-cu12: loaded, unused without a GPU).
# - Its own venv: the tests use a newer tritonclient.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${PERF_ANALYZER_VENV:-$ROOT/.venv-pa}"
PYTHON="${PYTHON:-python3}"
TRITONCLIENT_VERSION="2.51.0"

have_libb64() {
    ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d' ||
        [ -e /usr/lib/x86_64-linux-gnu/libb64.so.0d ] || [ -e /usr/lib/libb64.so.0d ]
}

if ! have_libb64; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing libb64-0d (apt-get)" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d >/dev/null
    else
        echo "perf_analyzer needs libb64.so.0d: run 'apt-get install libb64-0d' as root," \
            "then this script again" >&2
        exit 1
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi

installed() {
    "$VENV/bin/python" - "$TRITONCLIENT_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as metadata
import sys

try:
    ok = metadata.version("tritonclient") == sys.argv[1]
    metadata.version("nvidia-cuda-runtime-cu12")
except metadata.PackageNotFoundError:
    ok = False
sys.exit(0 if ok else 1)
PY
}

if ! installed || [ ! -x "$VENV/bin/perf_analyzer" ]; then
    echo "installing tritonclient==$TRITONCLIENT_VERSION and nvidia-cuda-runtime-cu12 into $VENV" >&2
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "tritonclient==$TRITONCLIENT_VERSION" nvidia-cuda-runtime-cu12
fi

# Proves the binary loads (both libraries found): prints "Perf Analyzer Version 2.51.0 ...".
PERF_ANALYZER_VENV="$VENV" "$ROOT/scripts/perf_analyzer" --version
echo "perf_analyzer: $VENV/bin/perf_analyzer"
echo "run it with:   $ROOT/scripts/perf_analyzer ARGS  (sets LD_LIBRARY_PATH for libcudart)"
