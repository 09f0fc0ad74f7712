#!/usr/bin/env bash
# Bounded coverage-guided fuzzing of the record deserializer (CI budget).
# Usage: fuzz/run.sh [RUNS]   (default 100000 inputs; needs the built extension)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-100000}
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c 'import atheris' 2>/dev/null; then
    # atheris ships manylinux wheels with libFuzzer inside: pip is enough
    "$PY" -m pip install -q "atheris>=2.3" || true
fi
if ! "$PY" -c 'import atheris' 2>/dev/null; then
    echo "fuzz: atheris is not installable for $("$PY" -V); running the hypothesis" \
         "mutation fuzzer instead" >&2
    HYPOTHESIS_PROFILE=thorough exec "$PY" -m pytest -q -p no:benchmark tests/test_fuzz_streams.py
fi
CORPUS=fuzz/corpus
rm -rf "$CORPUS"
"$PY" fuzz/fuzz_deserializer.py --write-seeds "$CORPUS"
LOG=$(mktemp)
start=$(date +%s)
# -rss_limit_mb: a decoded value may never need much memory; -timeout: no hangs
"$PY" fuzz/fuzz_deserializer.py "$CORPUS" -runs="$RUNS" -seed=1 -max_len=4096 \
    -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 2>"$LOG" || {
    tail -n 60 "$LOG" >&2
    echo "fuzz: FAILED (see above)" >&2
    exit 1
}
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$LOG" | grep -o '[0-9]*$' || echo "?")
echo "fuzz: $runs inputs run in $(( $(date +%s) - start ))s, no finding"
rm -f "$LOG"
