# flinkbuf task runner.  `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# What is installed: the demo's extras only, or everything the tests need.
DEMO_STAMP := $(VENV)/.installed-demo
DEV_STAMP  := $(VENV)/.installed-dev
# Test runs fail if the debug counters are missing; fuzzing budget per run.
export FLINKBUF_REQUIRE_DEBUG ?= 1
HYPOTHESIS_PROFILE ?= ci

.PHONY: all venv build build-dev build-debug build-asan test test-fast asan demo bench bench-smoke \
        experiment stubtest fuzz clean

all: build

# The demo needs the spark extra (PySpark, pyarrow, matplotlib); the tests,
# the benchmarks and fuzzing add the dev extra.
$(DEMO_STAMP): pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh $(PYTHON) $(VENV) spark
	touch $@

$(DEV_STAMP): pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh $(PYTHON) $(VENV) dev,spark
	touch $@ $(DEMO_STAMP)

venv: $(DEV_STAMP)

# Release build (what the demo and the benchmarks use).
build: $(DEMO_STAMP)
	$(PY) setup.py -q build_ext --inplace

build-dev: $(DEV_STAMP) build

# Debug build: live-object counters that the tests assert back to zero.
build-debug: $(DEV_STAMP)
	FLINKBUF_DEBUG=1 $(PY) setup.py -q build_ext --inplace

build-asan: $(DEV_STAMP)
	FLINKBUF_SANITIZE=address $(PY) setup.py -q build_ext --inplace

# Two workers (a test file stays on one), then the tests that measure rates
# alone, so that a neighbour's load cannot skew what they measure.
TEST_WORKERS ?= 2
test: build-debug
	HYPOTHESIS_PROFILE=$(HYPOTHESIS_PROFILE) $(PY) -X faulthandler -m pytest -q \
	  -n $(TEST_WORKERS) --dist loadfile -m "not serial" tests
	HYPOTHESIS_PROFILE=$(HYPOTHESIS_PROFILE) $(PY) -X faulthandler -m pytest -q -m serial tests
	$(PY) -m mypy.stubtest flinkbuf --allowlist tests/stubtest-allowlist.txt

test-fast: build-debug
	HYPOTHESIS_PROFILE=dev $(PY) -X faulthandler -m pytest -q -x tests

# The whole suite under AddressSanitizer (leak checking off: CPython itself leaks).
# The two experiment tests draw PNGs with matplotlib, whose prebuilt ft2font
# throws C++ exceptions that trip ASan's __cxa_throw interceptor (a CHECK
# failure inside matplotlib, not a report on our code); they are left out here.
# The Spark tests start a JVM, which does not run with the sanitizer's runtime
# preloaded (its launch script hangs): so do the spark-demo command's tests and
# the README's Spark example; the Python side of flinkbuf.spark is covered by
# the tests of it that need no JVM.
ASAN_DESELECT := --deselect tests/test_experiments.py::test_backpressure_experiment \
                 --deselect tests/test_experiments.py::test_slow_subpartition_experiment \
                 --ignore tests/test_spark.py --ignore tests/test_spark_cluster.py \
                 --ignore tests/test_spark_demo.py --ignore tests/test_spark_multihost.py \
                 --ignore tests/test_spark_sessions.py \
                 --deselect tests/test_readme.py::test_readme_spark_example_runs_without_warnings_of_its_own
asan: build-asan
	LD_PRELOAD=$$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \
	  HYPOTHESIS_PROFILE=ci PYTHONMALLOC=malloc $(PY) -X faulthandler -m pytest -q -p no:benchmark \
	  $(ASAN_DESELECT) tests
	$(MAKE) build-debug

stubtest: build-dev
	$(PY) -m mypy.stubtest flinkbuf --allowlist tests/stubtest-allowlist.txt

# The main demo: PySpark tasks (local mode) exchange records through flinkbuf
# under the 2015 Flink backpressure schedule, then the same keyed job beside
# Spark's shuffle (about a minute; needs Java, which bootstrap installs).
DEMO_OUT ?= out
demo: build
	$(PY) -m flinkbuf spark-demo --out $(DEMO_OUT) --phase-seconds 4
	@echo "figure: $(DEMO_OUT)/spark-backpressure.png   data: $(DEMO_OUT)/spark-backpressure.csv, $(DEMO_OUT)/spark-backpressure.json"

# Experiment 1 in one process (the 2015 Flink backpressure post): about 25 s.
experiment: build
	$(PY) -m flinkbuf experiment backpressure --out $(DEMO_OUT) --phase-seconds 4
	@echo "figure: $(DEMO_OUT)/backpressure.png   data: $(DEMO_OUT)/backpressure.csv, $(DEMO_OUT)/backpressure.json"

bench: build-dev
	$(PY) bench/run.py --repeat 3

bench-smoke: build-dev
	$(PY) bench/run.py --smoke
	$(PY) bench/arrow_task_cpu.py --rows 200000 --rounds 1
	$(PY) bench/debloat_sojourn.py --smoke
	$(PY) bench/debloat_release.py --smoke
	$(PY) bench/exchange_width.py --widths 2 4 --records 10
	$(PY) bench/keyed_count.py --records 20000 --rows 262144 --rounds 1 --no-flink
	$(PY) bench/emit_all.py --smoke

# Every generated file, wherever the sources sit: builds, outputs, the fuzzing
# corpus; in-place extensions, the library of csrc/ (libflinkbuf.so.0) and
# Cython's C (recognised by its header, so csrc/ and any hand-written C stay)
# anywhere under flinkbuf/; caches and egg-info anywhere but .venv and .git.
clean:
	rm -rf build dist out fuzz/corpus*
	find flinkbuf -type f \( -name '*.so' -o -name '*.so.[0-9]*' -o -name '*.pyd' \
	  -o -name '*.html' \) -delete
	find flinkbuf -type f \( -name '*.c' -o -name '*.cpp' \) \
	  -exec grep -l -m 1 '^/\* Generated by Cython' {} + | xargs -r rm -f
	find . \( -path ./.venv -o -path ./.git \) -prune -o -type d \( -name __pycache__ \
	  -o -name '*.egg-info' -o -name .pytest_cache -o -name .hypothesis -o -name .benchmarks \
	  -o -name .mypy_cache \) -prune -exec rm -rf {} +

# The README's picture of the live view, docs/live-view.png: the Spark demo's
# page in headless Chromium while its consumers are slowed (about a minute).
.PHONY: live-view-figure
live-view-figure: build
	$(PY) scripts/live_view_screenshot.py docs/live-view.png

# The README's figure, docs/backpressure.png: the backpressure experiment (about
# 25 s), copied only if its expectations held.
FIGURE_OUT ?= build/figure
.PHONY: figure
figure: build
	$(PY) -m flinkbuf experiment backpressure --out $(FIGURE_OUT) --phase-seconds 4
	cp $(FIGURE_OUT)/backpressure.png docs/backpressure.png

# The README's debloating figure, docs/debloat.png (about 35 s), copied only if
# its expectations held.
.PHONY: debloat-figure
debloat-figure: build
	$(PY) -m flinkbuf experiment debloat --out $(FIGURE_OUT)
	cp $(FIGURE_OUT)/debloat.png docs/debloat.png
