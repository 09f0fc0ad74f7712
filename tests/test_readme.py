"""The README's Python examples run as written."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_python_examples_run():
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


_WARNING = re.compile(r"\bWARN\s+(\w+):")
_SESSION_ONLY = """
import os, sys
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").getOrCreate()
spark.sparkContext.parallelize(range(10), 2).count()
"""


def _spark_warnings(code, tmp_path, name):
    import subprocess
    import sys

    script = tmp_path / name
    script.write_text(code + "\nspark.stop()\n")
    # No web UI: another Spark application on this machine (a test running
    # beside this one) would make it warn that its port is taken.
    env = dict(os.environ, PYTHONPATH=ROOT,
               PYSPARK_SUBMIT_ARGS="--conf spark.ui.enabled=false pyspark-shell")
    env.pop("PYSPARK_PYTHON", None)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return out, {m.group(1) for m in _WARNING.finditer(out.stderr)}


def test_readme_spark_example_runs_without_warnings_of_its_own(tmp_path):
    """The Spark example runs as written and makes Spark warn of nothing
    that starting a session alone does not (a task too large, say)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        (block,) = re.findall(r"```py\n(.*?)```", f.read(), re.S)
    check = ("\nassert len(counts) == 100 and sum(counts.values()) == 1_000_000, counts\n"
             "print('counted')\n")
    out, warnings = _spark_warnings(block + check, tmp_path, "example.py")
    assert "counted" in out.stdout
    _, baseline = _spark_warnings(_SESSION_ONLY, tmp_path, "session.py")
    assert warnings <= baseline, (warnings - baseline, out.stderr[-3000:])
