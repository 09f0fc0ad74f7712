#!/usr/bin/env bash
# Bounded coverage-guided fuzzing (the CI budget) of each target: the record
# deserializer, the wire decoder of connections, their frame reader fed
# byte streams cut anywhere, and the decoder of column batches (the arrow codec).
# Usage: fuzz/run.sh [RUNS]     (default 100000 inputs per target)
#
# atheris ships libFuzzer in its wheels, so pip is all it needs.  Coverage of
# the Cython/C code needs the extensions compiled by clang with
# -fsanitize-coverage (libFuzzer's counters, without its stack-depth hook,
# which atheris does not export): this script builds such a copy under
# build/fuzz-native (installing clang with apt-get if it can) and otherwise
# falls back, saying so, to Python-level coverage.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-100000}
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c 'import atheris' 2>/dev/null; then
    "$PY" -m pip install -q "atheris>=2.3" || true
fi
if ! "$PY" -c 'import atheris' 2>/dev/null; then
    echo "fuzz: atheris is not installable for $("$PY" -V); running the hypothesis" \
         "mutation fuzzer instead" >&2
    HYPOTHESIS_PROFILE=thorough exec "$PY" -m pytest -q -p no:benchmark tests/test_fuzz_streams.py
fi

NATIVE_DIR=build/fuzz-native
native=""
if ! command -v clang >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "fuzz: installing clang for native coverage" >&2
    # bounded, so that the whole run stays within CI's few minutes
    timeout 120 bash -c 'apt-get update -qq && apt-get install -y -qq clang' >/dev/null 2>&1 || true
fi
if command -v clang >/dev/null 2>&1; then
    if CC=clang CFLAGS="-fsanitize-coverage=inline-8bit-counters,pc-table,trace-cmp" FLINKBUF_DEBUG=1 "$PY" setup.py -q build_ext \
            --build-lib "$NATIVE_DIR" --build-temp "$NATIVE_DIR/temp" >/dev/null 2>&1; then
        # the pure-Python modules of every subpackage beside the built ones
        (cd flinkbuf && find . \( -name '*.py' -o -name py.typed \) \
            -exec cp --parents {} "../$NATIVE_DIR/flinkbuf/" \;)
        native="$NATIVE_DIR"
    else
        echo "fuzz: the clang build failed; Python-level coverage only" >&2
    fi
else
    echo "fuzz: clang is not available; Python-level coverage only" >&2
fi

ARTIFACTS=build/fuzz-artifacts/
mkdir -p "$ARTIFACTS"
for target in deserializer wire frame_reader columns; do
    CORPUS=fuzz/corpus-$target
    rm -rf "$CORPUS"
    "$PY" fuzz/fuzz_$target.py --write-seeds "$CORPUS"
    if [ -d "fuzz/regressions/$target" ]; then
        cp "fuzz/regressions/$target"/* "$CORPUS"/     # inputs that once found a bug
    fi
    LOG=$(mktemp)
    start=$(date +%s)
    # -rss_limit_mb: decoding may never need much memory; -timeout: no input may hang
    FLINKBUF_FUZZ_NATIVE="$native" "$PY" fuzz/fuzz_$target.py "$CORPUS" -runs="$RUNS" \
        -seed=1 -max_len=4096 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$ARTIFACTS$target-" 2>"$LOG" || {
        tail -n 60 "$LOG" >&2
        echo "fuzz $target: FAILED (see above; the input is in $ARTIFACTS; replay it with" \
             "python fuzz/fuzz_$target.py FILE)" >&2
        exit 1
    }
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$LOG" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o '#[0-9]*.*DONE.*cov: [0-9]*' "$LOG" | grep -o 'cov: [0-9]*' | tail -1 || true)
    echo "fuzz $target: $runs inputs run in $(( $(date +%s) - start ))s" \
         "(${native:+native+}python coverage; ${cov:-cov: n/a}, corpus $(ls "$CORPUS" | wc -l) files), no finding"
    rm -f "$LOG"
done
