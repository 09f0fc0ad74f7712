"""Helpers for the tests of the live view: tasks that report without Spark
(an in-process partition, writer and gate, as an exchange task has them),
a strict reader of Prometheus's text format, and a real headless Chromium
that loads a page and gives back what it rendered."""

import html.parser
import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest

import flinkbuf as fb
from flinkbuf.spark.exchange import ExchangeTask

# ---- tasks that report, without Spark -----------------------------------------------------


class Ctx:
    """What a reporter reads of a BarrierTaskContext."""

    def __init__(self, attempt, stage=3, attempt_number=0):
        self.attempt, self.stage, self.attempt_number = attempt, stage, attempt_number

    def taskAttemptId(self):
        return self.attempt

    def attemptNumber(self):
        return self.attempt_number

    def stageId(self):
        return self.stage


class LocalTask:
    """One task of an exchange of ``num_tasks`` in this process: a
    partition of ``num_tasks`` subpartitions with its writer, a gate over
    subpartition ``index`` (its own), the ExchangeTask over them, and a
    producer thread writing ``records`` records (then closing, which ends
    the gate)."""

    def __init__(self, nbp, index=0, num_tasks=1, records=0):
        self.partition = fb.create_partition(nbp, num_tasks, min_buffers=2 * num_tasks + 1)
        self.writer = fb.RecordWriter(self.partition, fb.RoundRobinSelector(),
                                      buffer_timeout=None)
        self.gate = fb.InputGate([(self.partition, index)])
        self.task = ExchangeTask(index, num_tasks, f"127.0.0.1:{40000 + index}", None,
                                 self.partition, self.writer, self.gate)
        self.records = records
        self.thread = threading.Thread(target=self._produce, daemon=True)

    def _produce(self):
        for i in range(self.records):
            self.writer.emit((i, i))
        self.writer.close()

    def run(self):
        """Produce and consume every record; the task's stats at the end."""
        self.thread.start()
        n = sum(1 for _ in self.gate)
        self.thread.join(30)
        assert n == self.records
        return self.task.stats()

    def close(self):
        self.gate.close()
        if self.partition.num_subpartitions > 1:
            self.partition.release()


def wait_for(predicate, timeout=10.0, what="the condition"):
    """Poll ``predicate()`` until it returns something true; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not hold within {timeout:g} s")
        time.sleep(0.05)


def tasks_of(doc, exchange=None):
    """{(exchange id, task, attempt): task doc} of a view's JSON document."""
    return {(e["id"], t["task"], t["attempt"]): t for e in doc["exchanges"]
            if exchange is None or e["id"] == exchange for t in e["tasks"]}


def closed_by_peer(sock, timeout=10.0):
    """Whether the peer closes ``sock`` within ``timeout`` seconds (what
    it sent first is read and dropped); ``sock`` is closed after."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        sock.close()


def get(url, timeout=10.0, headers=None):
    """(status, content type, body text) of a GET."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def get_json(url):
    status, kind, body = get(url)
    assert status == 200 and kind == "application/json", (status, kind, body[:300])
    return json.loads(body)


# ---- Prometheus's text format, read strictly -------------------------------------------------

_SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)\Z')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|\Z)')


def _unescape(text, escapes):
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            nxt = text[i + 1]
            if nxt not in escapes:
                raise ValueError(f"bad escape \\{nxt}")
            out.append(escapes[nxt])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _number(text):
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"a number spelled {text!r}")
    return int(text) if re.fullmatch(r"-?\d+", text) else value


def parse_prometheus(text):
    """{family name: (type, help, [(labels dict, value)])} of an exposition,
    checking every line: a HELP and a TYPE before a family's samples, a
    sample's name being its family's, labels quoted and escaped."""
    if text and not text.endswith("\n"):
        raise ValueError("the exposition must end with a line feed")
    families, current = {}, None
    for line in text.split("\n")[:-1] if text else []:
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            if name in families:
                raise ValueError(f"family {name} twice")
            families[name] = [None, _unescape(help_text, {"\\": "\\", "n": "\n"}), []]
            current = name
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            if name != current or kind not in ("counter", "gauge", "untyped"):
                raise ValueError(f"TYPE line {line!r}")
            families[name][0] = kind
        else:
            m = _SAMPLE.match(line)
            if not m or m.group(1) != current or families[current][0] is None:
                raise ValueError(f"sample line {line!r}")
            labels, rest = {}, m.group(2) or ""
            while rest:
                lm = _LABEL.match(rest)
                if not lm:
                    raise ValueError(f"labels of {line!r}")
                labels[lm.group(1)] = _unescape(lm.group(2), {"\\": "\\", '"': '"', "n": "\n"})
                rest = rest[lm.end():]
                if lm.group(3) == "," and not rest:
                    raise ValueError(f"a trailing comma in {line!r}")
            families[current][2].append((labels, _number(m.group(3))))
    return {name: tuple(f) for name, f in families.items()}


def prometheus_values(text, name):
    """{(exchange, task, attempt): value} of family ``name`` of an exposition."""
    _, _, samples = parse_prometheus(text)[name]
    return {(s["exchange"], int(s["task"]), int(s["attempt"])): v for s, v in samples}


# ---- a real browser -----------------------------------------------------------------------------

def chromium():
    """A headless-capable Chromium (FLINKBUF_CHROMIUM, else Debian's
    chromium on PATH), or skip saying how to get one."""
    for name in (os.environ.get("FLINKBUF_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome", "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    pytest.skip("no Chromium to load the live view in: scripts/bootstrap.sh installs Debian's "
                "chromium package (apt-get install chromium); or set FLINKBUF_CHROMIUM to a "
                "Chromium or Chrome binary")


def browse(url, *, budget_ms=3000, screenshot=None, size=(1400, 900), timeout=90):
    """Load ``url`` in headless Chromium and return the DOM it rendered
    after ``budget_ms`` ms of the page's (virtual) time, scripts run;
    with ``screenshot``, save a PNG of the page instead (and return "")."""
    with tempfile.TemporaryDirectory(prefix="flinkbuf-chromium-") as profile:
        cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
               "--hide-scrollbars", f"--user-data-dir={profile}",
               f"--window-size={size[0]},{size[1]}",
               f"--virtual-time-budget={budget_ms}"]
        cmd += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
        proc = subprocess.Popen(cmd + [url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"Chromium did not load {url} within {timeout} s")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, err[-2000:]
    return out


class Rendered(html.parser.HTMLParser):
    """What the page shows: per exchange, its bottleneck banner (the tasks
    it names, its text), each task row's attributes and text (and the text
    of each of its cells that has a class, in ``cells``), and each row of
    its buffer debloating table (``debloat``, by (task, gate))."""

    def __init__(self, dom):
        super().__init__()
        self.exchanges = {}
        self._exchange = None
        self._row = None
        self._cell = None
        self._banner = None
        self._depth = []
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section" and "data-exchange" in a:
            self._exchange = self.exchanges.setdefault(
                a["data-exchange"], {"state": a.get("data-state"), "bottleneck": None,
                                     "banner": "", "rows": {}})
        elif tag == "p" and "bottleneck" in (a.get("class") or "").split() \
                and self._exchange is not None:
            tasks = a.get("data-tasks", "")
            self._exchange["bottleneck"] = [int(t) for t in tasks.split(",") if t]
            self._banner = tag
        elif tag == "tr" and "data-task" in a and self._exchange is not None:
            self._row = {**a, "text": "", "cells": {}}
            self._exchange["rows"][int(a["data-task"])] = self._row
        elif tag == "tr" and "data-debloat-task" in a and self._exchange is not None:
            self._row = {**a, "text": "", "cells": {}}
            key = (int(a["data-debloat-task"]), int(a["data-gate"]))
            self._exchange.setdefault("debloat", {})[key] = self._row
        elif tag == "td" and self._row is not None and a.get("class"):
            self._cell = a["class"]
            self._row["cells"][self._cell] = ""

    def handle_endtag(self, tag):
        if tag == "td":
            self._cell = None
        elif tag == "tr":
            self._row = None
        elif tag == "p":
            self._banner = None
        elif tag == "section":
            self._exchange = None

    def handle_data(self, data):
        if self._row is not None:
            self._row["text"] += data
            if self._cell is not None:
                self._row["cells"][self._cell] += data
        if self._banner is not None and self._exchange is not None:
            self._exchange["banner"] += data
