"""The live view's newer metrics without Spark: soft and hard backpressure,
the producer's and the consumer's busy and idle time, and buffer
debloating per gate and per channel, from a task of this process to the
JSON and the Prometheus text; the store's exposition and history where
a report holds None; and the page in a real headless Chromium, for
reports whose values the test chooses."""

import html.parser
import threading
import time

import pytest
from live_helpers import Ctx, Rendered, browse, chromium, get, get_json, parse_prometheus, \
    wait_for

import flinkbuf as fb
from flinkbuf.io.metrics import TaskMetrics
from flinkbuf.io.producer import ProducerThread
from flinkbuf.spark import LiveView, _live_store, _reports
from flinkbuf.spark.exchange import ExchangeTask

FAST = {"buffer_debloat": True, "buffer_debloat_target": 0.05,
        "buffer_debloat_period": 0.01, "buffer_debloat_samples": 1,
        "buffer_debloat_threshold": 0}
NEW = ("softBackPressuredTimeMsPerSecond", "hardBackPressuredTimeMsPerSecond",
       "producerBusyTimeMsPerSecond", "producerIdleTimeMsPerSecond",
       "consumerBusyTimeMsPerSecond", "consumerIdleTimeMsPerSecond", "debloatedBufferSize",
       "estimatedTimeToConsumeBuffersMs", "inFlightBytes", "debloatGivenBackSegments",
       "debloatGivenBackBytes", "inputGates")


@pytest.fixture
def view():
    with LiveView(interval=0.05) as v:
        yield v


def _debloating_task(nbp, records):
    """A task of one whose gate debloats, its producer a ProducerThread
    (started by the caller)."""
    part = fb.create_partition(nbp, 1, min_buffers=4, buffer_debloat=True)
    writer = fb.RecordWriter(part, codec="bytes", buffer_timeout=0.01)
    gate = fb.InputGate([(part, 0)], codec="bytes", **FAST)
    task = ExchangeTask(0, 1, "127.0.0.1:40000", None, part, writer, gate)
    task.producer = ProducerThread(writer, (i.to_bytes(4, "big") * 25 for i in range(records)))
    return task


def test_a_debloating_task_s_metrics_reach_the_json_and_prometheus(view):
    with fb.NetworkBufferPool(64, 4096) as nbp:
        task = _debloating_task(nbp, 20_000)
        reporter = view._target("exchange-m", "the exchange", 1).start(task, Ctx(attempt=5))
        time.sleep(0.1)                     # the producer idle before it starts
        task.producer.start()
        n = 0
        for _ in task.gate:                 # a slow consumer: the producer waits
            n += 1
            if n % 20 == 0:
                time.sleep(0.001)
        task.producer.join(10)
        raw = task.gate._debloat_metrics()
        wait_for(lambda: reporter.sent >= 3, 10, "reports")
        reporter.stop(None)
        task.gate.close()
    assert n == 20_000 and raw["buffer_size"] is not None
    doc = wait_for(lambda: (d := get_json(view.url + "api/view"))["exchanges"][0]["state"]
                   == "FINISHED" and d, 10, "the task's end")
    m = doc["exchanges"][0]["tasks"][0]["metrics"]
    assert set(NEW) <= set(m)
    assert m["softBackPressuredTimeMsPerSecond"] + m["hardBackPressuredTimeMsPerSecond"] == \
        pytest.approx(m["backPressuredTimeMsPerSecond"])
    assert m["producerBusyTimeMsPerSecond"] + m["producerIdleTimeMsPerSecond"] + \
        m["backPressuredTimeMsPerSecond"] == pytest.approx(1000.0)
    assert m["consumerBusyTimeMsPerSecond"] + m["consumerIdleTimeMsPerSecond"] == \
        pytest.approx(1000.0)
    (gate,) = m["inputGates"]
    # The last report came after the gate's last sample: its size, as the gate says.
    assert gate["bufferDebloat"] and gate["debloatedBufferSize"] == raw["buffer_size"]
    assert m["debloatedBufferSize"] == raw["buffer_size"]
    assert len(gate["inFlightBytesPerChannel"]) == 1
    assert gate["inFlightBytes"] == sum(gate["inFlightBytesPerChannel"]) == m["inFlightBytes"]
    fields = doc["history"]["fields"]
    samples = doc["history"]["samples"]["exchange-m|0|5"]
    assert samples[-1][2 + fields.index("debloatedBufferSize")] == raw["buffer_size"]

    status, _, text = get(view.url + "metrics")
    families = parse_prometheus(text)
    labels = {"exchange": "exchange-m", "task": "0", "attempt": "5"}
    for name in NEW[:-1]:
        assert families["flinkbuf_task_" + name][2] == [(labels, m[name])], name
    assert families["flinkbuf_task_gate_debloatedBufferSize"][2] == \
        [(dict(labels, gate="0"), raw["buffer_size"])]
    assert families["flinkbuf_task_gate_inFlightBytes"][2] == \
        [(dict(labels, gate="0"), gate["inFlightBytes"])]


def _metrics(**values):
    """A report's metrics: a real (idle) task's snapshot, with ``values``."""
    with fb.NetworkBufferPool(8, 256) as nbp:
        part = fb.create_partition(nbp, 1)
        writer = fb.RecordWriter(part, buffer_timeout=None)
        gate = fb.InputGate([(part, 0)])
        snap = dict(TaskMetrics("t", writers=[writer], gates=[gate]).snapshot())
        writer.close()
        gate.close()
    snap.pop("task")
    snap.update(values)
    return snap


def _gate(size, channels, ttc=25.0, given_back=0):
    return {"gate": 0, "bufferDebloat": size is not None or bool(channels),
            "debloatedBufferSize": size, "estimatedTimeToConsumeBuffersMs": ttc,
            "buffersInUse": len(channels), "inFlightBytes": sum(channels) if channels else None,
            "inFlightBytesPerChannel": channels, "debloatGivenBackSegments": given_back}


def _report(store, key, metrics, n):
    doc = {"type": "report", "seq": 0, "elapsed": 1.0, "cpu": 0.0, "backlogs": [0] * n,
           "stats": {k: 0 for k in _reports.STATS}, "metrics": metrics}
    store.report(key, _reports.decode(_reports.encode(doc)[4:], n))   # as the server reads it


def _hello(store, exchange, index, n):
    return store.hello({"task": index, "attempt": 10 + index, "attempt_number": 0,
                        "stage": 1, "address": "a:1", "num_tasks": n, "exchange": exchange},
                       "p")


WIDE = [1000 * (k % 7) for k in range(100)]       # 100 channels: median 3000, max 6000


def _three_tasks(store):
    """Task 0 debloats over 3 channels, task 1 does not, task 2 debloats
    over 100 channels."""
    store.register("ex", "pipelined_exchange of RDD 1 into count", 3)
    sides = {"backPressuredTimeMsPerSecond": 960.0, "softBackPressuredTimeMsPerSecond": 10.0,
             "hardBackPressuredTimeMsPerSecond": 950.0, "producerBusyTimeMsPerSecond": 37.0,
             "producerIdleTimeMsPerSecond": 3.0, "consumerBusyTimeMsPerSecond": 996.0,
             "consumerIdleTimeMsPerSecond": 4.0, "idleTimeMsPerSecond": 4.0}
    for index, debloat in ((0, {"debloatedBufferSize": 2048, "inFlightBytes": 6144,
                                "estimatedTimeToConsumeBuffersMs": 25.0,
                                "debloatGivenBackSegments": 3, "debloatGivenBackBytes": 3 * 4096,
                                "inputGates": [_gate(2048, [1024, 4096, 1024], given_back=2)]}),
                           (1, {}),
                           (2, {"debloatedBufferSize": 512, "inFlightBytes": sum(WIDE),
                                "estimatedTimeToConsumeBuffersMs": 7.5,
                                "inputGates": [_gate(512, WIDE, 7.5)]})):
        _report(store, _hello(store, "ex", index, 3), _metrics(**sides, **debloat), 3)


def test_the_exposition_and_the_history_leave_out_what_a_report_has_as_none():
    store = _live_store.Store(0.5)
    _three_tasks(store)
    families = parse_prometheus(store.prometheus())

    def values(name):
        return {(s["task"], s.get("gate")): v for s, v in families[name][2]}

    assert values("flinkbuf_task_debloatedBufferSize") == {("0", None): 2048, ("2", None): 512}
    assert values("flinkbuf_task_debloatGivenBackSegments") == \
        {("0", None): 3, ("1", None): 0, ("2", None): 0}
    assert values("flinkbuf_task_gate_inFlightBytes") == {("0", "0"): 6144, ("2", "0"): sum(WIDE)}
    assert values("flinkbuf_task_gate_debloatGivenBackSegments") == {("0", "0"): 2, ("2", "0"): 0}
    assert values("flinkbuf_task_hardBackPressuredTimeMsPerSecond") == \
        {(str(i), None): 950.0 for i in range(3)}
    doc = store.document()
    fields = doc["history"]["fields"]
    sizes = {key: samples[-1][2 + fields.index("debloatedBufferSize")]
             for key, samples in doc["history"]["samples"].items()}
    assert sizes == {"ex|0|10": 2048, "ex|1|11": None, "ex|2|12": 512}
    tasks = doc["exchanges"][0]["tasks"]
    assert tasks[0]["metrics"]["inputGates"][0]["inFlightBytesPerChannel"] == [1024, 4096, 1024]


@pytest.mark.timeout(180)
def test_the_page_shows_each_side_and_the_debloating_per_gate(view):
    chromium()                            # skips, saying why, where there is none
    _three_tasks(view._store)
    page = Rendered(browse(view.url)).exchanges["ex"]
    row = page["rows"][0]["cells"]
    assert row["bp"].replace("soft", " soft").split() == \
        ["960", "soft", "10", "·", "hard", "950"]
    assert (row["producer-busy"].strip(), row["producer-idle"].strip(),
            row["consumer-busy"].strip(), row["consumer-idle"].strip()) == \
        ("37", "3", "996", "4")
    assert sorted(page["debloat"]) == [(0, 0), (2, 0)]       # task 1 does not debloat
    narrow, wide = page["debloat"][(0, 0)], page["debloat"][(2, 0)]
    assert (narrow["data-buffer-size"], narrow["data-in-flight"], narrow["data-channels"]) == \
        ("2048", "6144", "1024,4096,1024")
    assert "2048 B" in narrow["text"] and "3 (12.3 k B)" in narrow["text"]
    assert "100 channels: median 3000 B, max 6000 B" in wide["text"]


def test_a_report_of_a_gate_of_thousands_of_channels_goes_without_them():
    """The reporter's message stays within MAX_MESSAGE: the per-channel
    bytes are left out, the rest goes."""
    n = _reports.MAX_TASKS
    channels = [10 ** 15 + k for k in range(n)]          # 17 characters each
    metrics = _metrics(inputGates=[_gate(4096, channels)], inFlightBytes=sum(channels),
                       debloatedBufferSize=4096)
    task = type("Task", (), {"index": 0})()
    task.metrics = type("M", (), {"snapshot": staticmethod(lambda: dict(metrics, task="t"))})()
    task.stats = lambda: {k: 0 for k in _reports.STATS}
    task.partition = type("P", (), {"backlogs": staticmethod(lambda: [0] * n)})()
    reporter = _reports.Reporter.__new__(_reports.Reporter)
    reporter._task, reporter._seq, reporter._started = task, 0, time.monotonic()
    reporter._hello = {"num_tasks": n}
    message = reporter._message(None)
    assert len(message) - 4 <= _reports.MAX_MESSAGE
    doc = _reports.decode(message[4:], n)
    (gate,) = doc["metrics"]["inputGates"]
    assert gate["inFlightBytesPerChannel"] == [] and gate["inFlightBytes"] == sum(channels)
    assert doc["metrics"]["debloatedBufferSize"] == 4096


class _Charts(html.parser.HTMLParser):
    """Per exchange and charted metric: the plot's top, its lines' points
    by task ([(x, y)]) and its off-scale note's peak (or None)."""

    def __init__(self, dom):
        super().__init__()
        self.charts, self._exchange, self._plot = {}, None, None
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section" and "data-exchange" in a:
            self._exchange = a["data-exchange"]
        elif tag == "svg" and "chart-plot" in (a.get("class") or ""):
            self._plot = {"top": float(a["data-top"]), "lines": {}, "peak": None}
            self.charts[(self._exchange, a["data-metric"])] = self._plot
        elif tag == "polyline" and self._plot is not None:
            self._plot["lines"][int(a["data-task"])] = [
                tuple(map(float, p.split(","))) for p in a["points"].split()]
        elif tag == "text" and "off-scale" in (a.get("class") or "") and self._plot is not None:
            self._plot["peak"] = float(a["data-peak"])

    def handle_endtag(self, tag):
        if tag == "svg":
            self._plot = None


@pytest.mark.timeout(180)
def test_the_records_chart_keeps_the_present_in_view_however_high_an_earlier_peak(monkeypatch):
    """A calibration at 3.5 M records/s per task, then phases at 0.5 M and
    0.25 M: the chart's top is at most 4 times the last 10 s (rounded up),
    so the last phase fills a fifth of the height or more, the phase
    before it is drawn to scale, and the calibration runs along the top
    edge, its peak named.  An exchange whose records stopped keeps its
    whole history in scale."""
    chromium()
    clock = [1000.0]
    monkeypatch.setattr(_live_store, "_now", lambda: clock[0])
    base = _metrics()
    with LiveView(interval=0.5) as view:
        store = view._store
        store.register("quiet", "stopped after 5 s", 2)
        store.register("demo", "calibration, then phases", 2)
        keys = {ex: [_hello(store, ex, i, 2) for i in range(2)] for ex in ("quiet", "demo")}
        for k in range(50):                                # 0.5 s apart, 24.5 s in all
            t = 0.5 * k
            clock[0] = 1000.0 + t
            rates = {"demo": 3.5e6 if t < 2.5 else 5e5 if t < 12.5 else 2.5e5,
                     "quiet": 2e6 if t < 5 else 0.0}
            for ex, rate in rates.items():
                for key in keys[ex]:
                    _report(store, key, dict(base, numRecordsInPerSecond=rate), 2)
        charts = _Charts(browse(view.url)).charts
    plot = charts[("demo", "numRecordsInPerSecond")]
    H, T, B = 170, 8, 20                                  # the plot's height and margins
    bottom = H - B
    assert 4 * 2.5e5 <= plot["top"] <= 1.25 * 4 * 2.5e5 and plot["peak"] == 3.5e6
    for task in (0, 1):
        points = plot["lines"][task]
        assert len(points) == 50
        assert all(y == T for _, y in points[:5])        # the calibration, on the top edge
        last, before = points[-1][1], points[10][1]
        assert bottom - last >= 0.2 * (bottom - T)        # the present, a fifth up or more
        assert T < before and bottom - before == pytest.approx(2 * (bottom - last), abs=0.2)
    quiet = charts[("quiet", "numRecordsInPerSecond")]
    assert quiet["top"] >= 2e6 and quiet["peak"] is None
    assert all(bottom - y == pytest.approx((bottom - T) * 2e6 / quiet["top"], abs=0.2)
               for _, y in quiet["lines"][0][:10])       # to scale
    assert charts[("demo", "backPressuredTimeMsPerSecond")]["top"] == 1000
