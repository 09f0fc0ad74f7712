"""Apache Flink's own keyed count (bench/flink/KeyedCount.java) on this
machine, for bench/keyed_count.py's ``flink_jvm`` row.

Flink's jars come from PyPI's ``apache-flink-libraries`` package (PyFlink
ships them in it): ``pip download`` fetches it once into a cache under your
cache directory (``$XDG_CACHE_HOME/flinkbuf/flink``, by default
``~/.cache/flinkbuf/flink``; ``FLINKBUF_FLINK_CACHE`` names another), and the
jars the job needs (``flink-dist`` and the logging ones) are taken out of it
beside it; nothing is installed.  ``javac`` compiles the job into the same
cache.  A :class:`Job` runs the job in a JVM of its own, a job at a time
when asked, or says why it cannot run here (no Java, no jars, no network
for the download).
"""

import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "flink", "KeyedCount.java")
PACKAGE = "apache-flink-libraries"
# The jars of PyFlink's lib/ that a DataStream job on a local MiniCluster needs.
JARS = ("flink-dist", "log4j")
TIMEOUT = 1800.0


class Unavailable(Exception):
    """Flink's job cannot run on this machine (the message says why)."""


def cache_dir():
    """Where the package, its jars and the compiled job are kept."""
    if os.environ.get("FLINKBUF_FLINK_CACHE"):
        return os.environ["FLINKBUF_FLINK_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "flinkbuf", "flink")


def _wanted(name):
    base = os.path.basename(name)
    return base.endswith(".jar") and "/lib/" in name and base.startswith(JARS)


def _extract(archive, lib):
    """The jars the job needs out of the downloaded wheel or sdist, into ``lib``."""
    os.makedirs(lib, exist_ok=True)
    if archive.endswith(".whl"):
        with zipfile.ZipFile(archive) as z:
            members = [m for m in z.namelist() if _wanted(m)]
            for m in members:
                with z.open(m) as src, open(os.path.join(lib, os.path.basename(m)), "wb") as dst:
                    shutil.copyfileobj(src, dst)
    else:
        with tarfile.open(archive) as t:
            members = [m for m in t.getmembers() if m.isfile() and _wanted(m.name)]
            for m in members:
                with t.extractfile(m) as src, \
                        open(os.path.join(lib, os.path.basename(m.name)), "wb") as dst:
                    shutil.copyfileobj(src, dst)
    if not members:
        raise Unavailable(f"{os.path.basename(archive)} has no flink-dist jar")


def jars(cache):
    """The directory of Flink's jars in ``cache``, downloading the package
    first if they are not there yet."""
    lib = os.path.join(cache, "lib")
    if glob.glob(os.path.join(lib, "flink-dist*.jar")):
        return lib
    os.makedirs(cache, exist_ok=True)
    archives = glob.glob(os.path.join(cache, "apache_flink_libraries-*"))
    if not archives:
        print(f"flink_jvm: downloading {PACKAGE} (about 330 MB) into {cache}", flush=True)
        out = subprocess.run([sys.executable, "-m", "pip", "download", PACKAGE, "--no-deps",
                              "-d", cache], capture_output=True, text=True, check=False)
        archives = glob.glob(os.path.join(cache, "apache_flink_libraries-*"))
        if out.returncode != 0 or not archives:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise Unavailable(f"pip download {PACKAGE} failed ({last})")
    _extract(sorted(archives)[-1], lib)
    return lib


def compiled(cache, lib):
    """The directory of the compiled job (compiled again when the source is newer)."""
    classes = os.path.join(cache, "classes")
    target = os.path.join(classes, "KeyedCount.class")
    if os.path.exists(target) and os.path.getmtime(target) >= os.path.getmtime(SOURCE):
        return classes
    os.makedirs(classes, exist_ok=True)
    out = subprocess.run(["javac", "-cp", os.path.join(lib, "*"), "-d", classes, SOURCE],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise Unavailable(f"javac failed:\n{out.stderr[-2000:]}")
    return classes


class Job:
    """Flink's job in a JVM of its own, warmed up by ``warmup`` jobs of
    ``records`` records when made; :meth:`run` runs one more and returns
    its (records/s, CPU ns per record of the JVM).  :class:`Unavailable`
    when Java, javac or the jars are missing.  Close it (a context
    manager) to end the JVM."""

    def __init__(self, records, warmup=2):
        missing = [tool for tool in ("java", "javac") if shutil.which(tool) is None]
        if missing:
            raise Unavailable(f"{' and '.join(missing)} not found")
        cache = cache_dir()
        lib = jars(cache)
        classes = compiled(cache, lib)
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            ["java", "-cp", os.pathsep.join([classes, os.path.join(lib, "*")]),
             "-Dlog4j2.level=ERROR", "-Dlog4j2.StatusLogger.level=OFF",
             "KeyedCount", str(records), str(warmup)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        try:
            for _ in range(warmup):
                self._result()
            if self._proc.stdout.readline().strip() != "ready":
                self._failed()
        except BaseException:
            self.close()
            raise

    def _failed(self):
        self._proc.kill()
        self._proc.wait()
        self._stderr.seek(0)
        raise RuntimeError(f"Flink's job failed ({self._proc.returncode}):\n"
                           f"{self._stderr.read()[-3000:].decode(errors='replace')}")

    def _result(self):
        fields = self._proc.stdout.readline().split()
        if fields[:1] != ["job"]:
            self._failed()
        rate, cpu = float(fields[3]), float(fields[4])
        if fields[2] == "warmup":
            print(f"flink_jvm warm-up job {fields[1]}: {rate / 1e6:8.2f} M records/s  "
                  f"cpu {cpu:6.0f} ns/record", flush=True)
        return rate, cpu

    def run(self):
        self._proc.stdin.write("run\n")
        self._proc.stdin.flush()
        return self._result()

    def close(self):
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
