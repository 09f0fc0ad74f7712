"""The package's types, as ``mypy --strict`` sees them from a user's script:
the README's examples type-check, and the types a user gets for partitions,
addresses, metrics and an exchange task's stats are precise (not ``Any``).

mypy reads flinkbuf from this checkout (its stubs beside the compiled
modules, its annotated Python modules) and checks those modules too, with
the same strictness: an unannotated function in them fails here."""

import importlib
import importlib.util
import os
import re
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_examples():
    """The README's Python examples: the ```python blocks and the ```py
    (Spark) one."""
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(r"```py(?:thon)?\n(.*?)```", f.read(), re.S)


def run_mypy(tmp_path, files):
    """``mypy --strict`` over ``files`` ({name: source}) with flinkbuf taken
    from this checkout; returns (exit code, output)."""
    for name, source in files.items():
        (tmp_path / name).write_text(source)
    config = ["[mypy]", "strict = True", f"mypy_path = {ROOT}", "cache_dir = /dev/null"]
    if importlib.util.find_spec("pyspark") is None:
        # The Spark example and flinkbuf.spark's stubs import PySpark (the
        # spark extra); without it only flinkbuf's side can be checked.
        config += ["[mypy-pyspark.*]", "ignore_missing_imports = True"]
    (tmp_path / "mypy.ini").write_text("\n".join(config) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--no-error-summary",
         "--show-error-codes", *sorted(files)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


# The packages whose public names are typed (flinkbuf.io.metrics and
# flinkbuf.errors are modules of their own).
PACKAGES = ("flinkbuf", "flinkbuf.buffer", "flinkbuf.serialization", "flinkbuf.io",
            "flinkbuf.io.metrics", "flinkbuf.network", "flinkbuf.errors", "flinkbuf.spark")
# Functions whose result is whatever the record was: Any is their type.
RETURN_RECORDS = {"flinkbuf.serialization.decode"}


def test_the_readme_examples_type_check_strictly(tmp_path):
    examples = readme_examples()
    assert len(examples) >= 5              # four ```python blocks and the Spark one
    assert any("pipelined_exchange" in e for e in examples)
    # Each example a module of its own: they reuse names, as separate scripts do.
    files = {f"readme_example_{i}.py": source for i, source in enumerate(examples)}
    # Every package too, so that all of their modules and stubs are checked.
    files["import_all.py"] = "".join(f"import {p}\n" for p in PACKAGES)
    code, out = run_mypy(tmp_path, files)
    assert (code, out) == (0, ""), out


def test_no_public_name_is_any(tmp_path):
    """Every name the packages export has a type, and no function returns
    Any (an unannotated one does) unless it returns records."""
    lines = [f"import {p}" for p in PACKAGES]
    names = []
    for package in PACKAGES:
        for name in importlib.import_module(package).__all__:
            names.append(f"{package}.{name}")
            lines.append(f"reveal_type({package}.{name})")
    code, out = run_mypy(tmp_path, {"public.py": "\n".join(lines) + "\n"})
    revealed = {names[int(line) - len(PACKAGES) - 1]: type_text for line, type_text in
                re.findall(r'^public\.py:(\d+): note: Revealed type is "(.*)"$', out, re.M)}
    assert sorted(revealed) == sorted(names), out
    untyped = {name: type_text for name, type_text in revealed.items()
               if type_text == "Any"
               or (type_text.endswith("-> Any") and name not in RETURN_RECORDS)}
    assert not untyped, untyped


# Each line: an expression and the type mypy must reveal for it.
REVEALS = textwrap.dedent('''\
    import secrets

    import flinkbuf as fb
    from flinkbuf.io import pointwise_connections
    from flinkbuf.io.metrics import backpressure_level
    from flinkbuf.network import NetworkEnvironment, RemoteError, format_address
    from flinkbuf.spark import ExchangeTask, current_task, local_pipeline


    def check() -> None:
        with NetworkEnvironment(64, 4096, secret=secrets.token_bytes(32)) as env:
            partition = fb.create_partition(env.network_buffer_pool, num_subpartitions=2)
            writer = fb.RecordWriter(partition, fb.HashSelector(max_parallelism=256))
            gate = env.create_input_gate([(env.address, "p", 0)], name="g")
            metrics = fb.TaskMetrics("t", writers=[writer], gates=[gate])
            snapshot = metrics.snapshot()
            task = current_task()
            assert task is not None
            stats = task.stats()
            pipeline = local_pipeline(range(3), lambda it: (x * 2 for x in it))
            reveal_type(partition)  # ResultPartition
            reveal_type(env.address)  # tuple[str, int]
            reveal_type(env.network_buffer_pool)  # NetworkBufferPool
            reveal_type(env.connection_stats()[0]["bytes_in"])  # int
            reveal_type(env.connections())  # list[Connection]
            reveal_type(env.__enter__())  # NetworkEnvironment
            reveal_type(gate)  # InputGate
            reveal_type(snapshot)  # TaskMetricsSnapshot
            reveal_type(snapshot["outPoolUsage"])  # float
            reveal_type(snapshot["numRecordsOut"])  # int
            reveal_type(snapshot["backPressureLevel"])  # Literal['OK'] | Literal['LOW'] | Literal['HIGH']
            reveal_type(snapshot["task"])  # str
            reveal_type(metrics.to_json())  # str
            reveal_type(backpressure_level(0.2))  # Literal['OK'] | Literal['LOW'] | Literal['HIGH']
            reveal_type(task)  # ExchangeTask
            reveal_type(task.address)  # str
            reveal_type(task.metrics)  # TaskMetrics
            reveal_type(stats)  # _ExchangeTaskStats
            reveal_type(stats["records_out"])  # int
            reveal_type(stats["back_pressured_seconds"])  # float
            reveal_type(stats["first_record_seconds"])  # float | None
            reveal_type(pipeline.stats()[0]["buffers_in_use"])  # int
            reveal_type(pointwise_connections(2, 3))  # tuple[list[int], list[list[tuple[int, int]]]]
            reveal_type(format_address(env.address))  # str
            reveal_type(RemoteError("ValueError", "bad").type_name)  # str
            reveal_type(fb.io.default_max_parallelism(4))  # int
            reveal_type(partition.pool.request_buffer())  # Buffer | None
            reveal_type(writer.partition)  # ResultPartition
''')


def _short(type_text):
    """``flinkbuf.io._io.ResultPartition`` -> ``ResultPartition``; a
    TypedDict is named by its class."""
    m = re.match(r"TypedDict\('?([\w.]+)'?, ", type_text)
    if m:
        type_text = m.group(1)
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])", "", type_text)


def test_revealed_types_are_precise(tmp_path):
    code, out = run_mypy(tmp_path, {"reveals.py": REVEALS})
    lines = REVEALS.splitlines()
    expected = {n + 1: line.split("#")[1].strip()
                for n, line in enumerate(lines) if "reveal_type(" in line}
    revealed = {}
    for m in re.finditer(r'^reveals\.py:(\d+): note: Revealed type is "(.*)"$', out, re.M):
        revealed[int(m.group(1))] = _short(m.group(2))
    other = [line for line in out.splitlines()
             if line and "Revealed type is" not in line]
    assert not other, out                  # nothing but the reveals: no error
    assert revealed == expected, out
    assert not any("Any" in t for t in revealed.values())
