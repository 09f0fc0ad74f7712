"""The live view without Spark: tasks of this process (a partition, a
writer and a gate, as an exchange task has them) report to a LiveView;
its JSON and Prometheus text match their own stats; reports that are not
authenticated or not well formed are refused while the others go on; a
view on loopback refuses other addresses; the report messages and the
Prometheus text survive any input (hypothesis); ``flinkbuf monitor``
shows the view.  The page in a real browser, during a Spark exchange, is
in test_spark.py."""

import json
import math
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref

import pytest
from hypothesis import given
from hypothesis import strategies as st
from live_helpers import (
    Ctx,
    LocalTask,
    closed_by_peer,
    get,
    get_json,
    parse_prometheus,
    prometheus_values,
    tasks_of,
    wait_for,
)

import flinkbuf as fb
from flinkbuf.errors import AuthenticationError, RemoteConnectionError
from flinkbuf.network import handshake
from flinkbuf.spark import LiveView, _live_store, _prometheus, _reports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _live_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("flinkbuf-live")]


@pytest.fixture
def view():
    with LiveView(interval=0.05) as v:
        yield v
    wait_for(lambda: not _live_threads(), 10, "the view's threads to end")


@pytest.fixture
def nbp():
    with fb.NetworkBufferPool(64, 1024) as pool:
        yield pool


# ---- a task's reports, end to end ---------------------------------------------------------

def test_a_task_reports_while_it_runs_and_its_totals_match_at_the_end(view, nbp):
    target = view._target("exchange-a", "the exchange", 1)
    local = LocalTask(nbp, records=300_000)
    reporter = target.start(local.task, Ctx(attempt=17))
    stats = local.run()
    wait_for(lambda: reporter.sent >= 1, 10, "a report")
    reporter.stop(None)
    assert not reporter.alive and reporter.error is None
    doc = wait_for(lambda: (d := get_json(view.url + "api/view"))["exchanges"][0]["state"]
                   == "FINISHED" and d, 10, "the task's end")
    (exchange,) = doc["exchanges"]
    assert (exchange["id"], exchange["name"], exchange["num_tasks"]) == \
        ("exchange-a", "the exchange", 1)
    (task,) = exchange["tasks"]
    assert (task["task"], task["attempt"], task["stage"], task["state"], task["error"]) == \
        (0, 17, 3, "FINISHED", None)
    stats.pop("task")
    assert task["stats"] == stats                      # the task's own totals, exactly
    m = task["metrics"]
    assert (m["numRecordsOut"], m["numBytesOut"], m["numRecordsIn"], m["numBytesIn"]) == \
        (stats["records_out"], stats["bytes_out"], stats["records_in"], stats["bytes_in"])
    assert m["backPressureLevel"] in ("OK", "LOW", "HIGH") and task["reports"] >= 2
    assert 0 < task["report_cpu_seconds"] < 1.0
    # The history: a sample per report, each field named.
    samples = doc["history"]["samples"]["exchange-a|0|17"]
    assert len(samples) == task["reports"] and doc["seq"] == samples[-1][0]
    assert len(samples[0]) == 2 + len(doc["history"]["fields"])
    assert get_json(view.url + f"api/view?since={doc['seq']}")["history"]["samples"] == {}

    text = get(view.url + "metrics")
    assert text[:2] == (200, _prometheus.CONTENT_TYPE)
    families = parse_prometheus(text[2])
    key = ("exchange-a", 0, 17)
    for name, value in (("numRecordsOut", stats["records_out"]),
                        ("numBytesOut", stats["bytes_out"]),
                        ("numRecordsIn", stats["records_in"]),
                        ("numBytesIn", stats["bytes_in"])):
        assert families[f"flinkbuf_task_{name}"][0] == "counter"
        assert prometheus_values(text[2], f"flinkbuf_task_{name}") == {key: value}
    assert prometheus_values(text[2], "flinkbuf_task_backPressuredTimeMsPerSecond") == \
        {key: m["backPressuredTimeMsPerSecond"]}
    states = {s["state"]: v for s, v in families["flinkbuf_task_state"][2]}
    assert states == {"RUNNING": 0, "FINISHED": 1, "FAILED": 0, "CANCELED": 0, "LOST": 0}
    levels = {s["level"]: v for s, v in families["flinkbuf_task_backPressureLevel"][2]}
    assert sum(levels.values()) == 1 and levels[m["backPressureLevel"]] == 1
    local.close()


def test_the_page_and_what_else_the_server_answers(view):
    status, kind, page = get(view.url)
    assert status == 200 and kind.startswith("text/html") and "live.js" in page
    assert "http://" not in page.replace(view.url, "") and "https://" not in page   # no CDN
    status, kind, script = get(view.url + "live.js")
    assert status == 200 and "javascript" in kind and "fetch('api/view" in script
    assert "innerHTML" not in script                  # data reaches the page as text only
    assert get(view.url + "nothing")[0] == 404
    assert get(view.url + "api/view?since=x")[0] == 400
    request = urllib_request(view.url, method="POST")
    assert request[0] == 405
    assert urllib_request(view.url + "metrics", method="HEAD")[0:2] == (200, "")


def urllib_request(url, method):
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, data=None),
                                    timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_failed_task_and_a_task_whose_process_dies(view, nbp, tmp_path):
    target = view._target("exchange-b", "b", 2)
    local = LocalTask(nbp, index=1, num_tasks=2)
    reporter = target.start(local.task, Ctx(attempt=5))
    wait_for(lambda: reporter.sent >= 1, 10, "a report")
    reporter.stop(ValueError("the input\nwas bad"))
    local.close()
    # A task in another process, killed while it reports.
    script = tmp_path / "task.py"
    script.write_text(
        "import sys, time, pickle\n"
        "import flinkbuf as fb\n"
        "from live_helpers import Ctx, LocalTask\n"
        "target = pickle.loads(bytes.fromhex(sys.argv[1]))\n"
        "local = LocalTask(fb.NetworkBufferPool(16, 1024), index=0, num_tasks=2)\n"
        "reporter = target.start(local.task, Ctx(attempt=4))\n"
        "while reporter.sent < 1: time.sleep(0.01)\n"
        "print('reporting', flush=True)\n"
        "time.sleep(60)\n")
    import pickle
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]))
    child = subprocess.Popen([sys.executable, str(script), pickle.dumps(target).hex()],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline() == "reporting\n"
        child.kill()
    finally:
        child.kill()
        child.wait(30)
        child.stdout.close()
    tasks = wait_for(lambda: (t := tasks_of(view.snapshot()))[("exchange-b", 0, 4)]["state"]
                     == "LOST" and t, 10, "the killed task to show as lost")
    assert tasks[("exchange-b", 1, 5)]["state"] == "FAILED"
    assert tasks[("exchange-b", 1, 5)]["error"] == "ValueError: the input was bad"
    assert "closed before the task's last report" in tasks[("exchange-b", 0, 4)]["error"]
    assert view.snapshot()["exchanges"][0]["state"] == "FAILED"


# ---- what is refused ------------------------------------------------------------------------

def _connect(view):
    return socket.create_connection(view.report_address, timeout=10)


def _authenticated(view, secret=None):
    sock = _connect(view)
    handshake.client(sock, secret or view._secret, "127.0.0.1:1", _reports.SEGMENT_SIZE, 10)
    return sock


def test_unauthenticated_and_malformed_reports_are_refused_without_harm(view, nbp):
    target = view._target("exchange-c", "c", 1)
    local = LocalTask(nbp)
    reporter = target.start(local.task, Ctx(attempt=9))
    wait_for(lambda: reporter.sent >= 2, 10, "reports")
    hello = {"type": "hello", "version": 1, "exchange": "exchange-c", "task": 0,
             "num_tasks": 1, "attempt": 99, "attempt_number": 0, "stage": 3,
             "address": "x:1"}
    refused = view.refused

    garbage = _connect(view)                                  # not flinkbuf at all
    garbage.sendall(b"GET / HTTP/1.1\r\n\r\n" * 10)
    assert closed_by_peer(garbage)
    with pytest.raises(AuthenticationError):                  # a wrong secret
        _authenticated(view, secret=b"w" * 32)
    for body in (b"{not json", json.dumps([1, 2]).encode(),  # malformed first messages
                 json.dumps(dict(hello, task=1)).encode(),
                 json.dumps(dict(hello, exchange="unknown")).encode(),
                 json.dumps(dict(hello, num_tasks=2)).encode(),
                 json.dumps({"type": "report"}).encode()):
        sock = _authenticated(view)
        sock.sendall(struct.pack(">I", len(body)) + body)
        assert closed_by_peer(sock), body
    sock = _authenticated(view)                               # too large a message
    sock.sendall(struct.pack(">I", _reports.MAX_MESSAGE + 1) + b"x" * 100)
    assert closed_by_peer(sock)
    sock = _authenticated(view)                               # a bad report after a hello
    sock.sendall(_reports.encode(hello) + _reports.encode({"type": "report", "seq": -1}))
    assert closed_by_peer(sock)
    # A flood of connections that never authenticate: the oldest go.
    flood = [_connect(view) for _ in range(40)]
    assert wait_for(lambda: view._collector.connections[1] <= 32, 10, "the budget")
    for s in flood:
        s.close()

    sent = reporter.sent
    wait_for(lambda: reporter.sent >= sent + 3, 10, "the task's reports to go on")
    assert reporter.error is None
    local.run()
    reporter.stop(None)
    tasks = wait_for(lambda: (t := tasks_of(view.snapshot()))[("exchange-c", 0, 9)]["state"]
                     == "FINISHED" and t, 10, "the task's end")
    # The hello of attempt 99 was accepted and its report refused: that
    # attempt is lost, the real one finished.
    assert tasks[("exchange-c", 0, 99)]["state"] == "LOST"
    assert view.refused >= refused + 10
    assert prometheus_values(view.prometheus(), "flinkbuf_task_numRecordsIn")[
        ("exchange-c", 0, 9)] == 0
    (_, _, [(_, count)]) = parse_prometheus(view.prometheus())["flinkbuf_live_reports_refused"]
    assert count == view.refused
    local.close()


def _local_address():
    """An address of this host other than loopback, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))      # no packet is sent
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_a_view_on_loopback_refuses_other_addresses(view):
    port = view.address[1]
    other = _local_address()
    if other is not None:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((other, port), timeout=10).close()
    # A page of another site, reaching it through a name of its own.
    status, _, body = get(view.url, headers={"Host": f"attacker.example:{port}"})
    assert status == 403 and "loopback" in body
    assert get(view.url + "api/view", headers={"Host": f"evil:{port}"})[0] == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
        assert get(view.url + "api/view", headers={"Host": host})[0] == 200


def test_close_and_the_session_s_end_leave_no_thread():
    view = LiveView()
    assert _live_threads() == [f"flinkbuf-live-view-{view.report_address[1]}"]
    assert get(view.url + "api/view")[0] == 200
    view.close()
    view.close()
    assert not _live_threads() and view.closed

    class Session:                              # as a SparkContext: _jsc is None once stopped
        _jsc = object()

    session = Session()
    view = LiveView()
    view._session = weakref.ref(session)
    time.sleep(0.3)
    assert not view.closed
    session._jsc = None
    wait_for(lambda: view.closed and not _live_threads(), 10, "the view to close")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="interval must be >= 0.05"):
        LiveView(interval=0.01)
    with pytest.raises(ValueError, match="port must be <= 65535"):
        LiveView(port=70000)
    with pytest.raises(TypeError, match="host must be a str"):
        LiveView(host=1)
    with pytest.raises(ValueError, match="host must name an address"):
        LiveView(host="")               # not every address by accident
    with LiveView() as v:
        with pytest.raises(OSError, match="cannot listen"):
            LiveView(port=v.address[1])
        with pytest.raises(ValueError, match="since must be >= 0"):
            v.snapshot(since=-1)
    with pytest.raises(ValueError, match="is closed"):
        v._target("x", "x", 1)


# ---- the bottleneck -----------------------------------------------------------------------------

def _task(index, level, idle, records_in=100.0, in_pool=0.5, state="RUNNING"):
    t = _live_store._Task({"task": index, "attempt": index, "attempt_number": 0, "stage": 0,
                           "address": "a", "num_tasks": 3}, "p", 0.0)
    t.state = state
    t.metrics = {"backPressureLevel": level, "idleTimeMsPerSecond": idle,
                 "numRecordsInPerSecond": records_in, "inPoolUsage": in_pool}
    return t


def test_the_bottleneck_is_busy_while_the_tasks_feeding_it_are_backpressured():
    names = lambda tasks: [t.index for t, _, _ in _live_store.bottlenecks(tasks)]  # noqa: E731
    # Task 2's consumer never waits while the producers are blocked: Flink's reading.
    assert names([_task(0, "HIGH", 990), _task(1, "HIGH", 980), _task(2, "HIGH", 3)]) == [2]
    why = _live_store.bottlenecks([_task(0, "HIGH", 990), _task(1, "LOW", 10)])[0][1]
    assert "task 0 HIGH, task 1 LOW" in why and "waits for input only 10 ms/s" in why
    # Nobody backpressured: no bottleneck, however busy.
    assert names([_task(0, "OK", 0), _task(1, "OK", 0)]) == []
    # A consumer with no input left (done) is not one; nor one that ended.
    assert names([_task(0, "HIGH", 900), _task(1, "HIGH", 0, records_in=0, in_pool=0)]) == []
    assert names([_task(0, "HIGH", 900), _task(1, "HIGH", 0, state="LOST")]) == []
    # Several, the busiest first.
    assert names([_task(0, "HIGH", 300), _task(1, "HIGH", 100)]) == [1, 0]


# ---- the messages and the exposition, for any input ---------------------------------------------

_COUNT = st.integers(0, 2 ** 63 - 1)
_REAL = st.floats(0, 1e15, allow_nan=False)
_MS = st.floats(0, 1000, allow_nan=False)
_RATIO = st.floats(0, 1, allow_nan=False)
_TEXT = st.text(st.characters(min_codepoint=32, blacklist_characters="\x7f"), min_size=1,
                max_size=20)
_KINDS = {"count": _COUNT, "seconds": _REAL, "rate": _REAL, "ms": _MS, "ratio": _RATIO,
          "level": st.sampled_from(_reports.LEVELS),
          "seconds?": st.one_of(st.none(), _REAL), "count?": st.one_of(st.none(), _COUNT),
          "millis?": st.one_of(st.none(), _REAL), "flag": st.booleans(),
          "channels": st.lists(_COUNT, max_size=8),
          "gates": st.deferred(lambda: st.lists(_fields(_reports.GATE), max_size=3))}


def _fields(schema):
    return st.fixed_dictionaries({k: _KINDS[kind] for k, kind in schema.items()})


@st.composite
def _messages(draw):
    n = draw(st.integers(1, 8))
    hello = {"type": "hello", "version": 1, "exchange": draw(_TEXT), "task": draw(
        st.integers(0, n - 1)), "num_tasks": n, "attempt": draw(_COUNT),
        "attempt_number": draw(_COUNT), "stage": draw(_COUNT), "address": draw(_TEXT)}
    report = {"type": "report", "seq": draw(_COUNT), "elapsed": draw(_REAL),
              "cpu": draw(_REAL), "metrics": draw(_fields(_reports.METRICS)),
              "stats": draw(_fields(_reports.STATS)),
              "backlogs": draw(st.lists(_COUNT, min_size=n, max_size=n))}
    if draw(st.booleans()):
        state = draw(st.sampled_from(_reports.END_STATES))
        report = dict(report, type="end", state=state,
                      error=draw(st.one_of(st.none(), _TEXT)))
    return n, hello, report


@given(_messages())
def test_every_well_formed_message_decodes_to_itself(messages):
    n, hello, report = messages
    for doc, num_tasks in ((hello, None), (report, n)):
        message = _reports.encode(doc)
        assert struct.unpack(">I", message[:4])[0] == len(message) - 4
        assert _reports.decode(message[4:], num_tasks) == doc


def _json_values():
    leaves = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                       st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5))
    return st.recursive(leaves, lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
        max_leaves=12)


@given(_messages(), st.data())
def test_a_message_changed_in_any_field_is_refused_with_a_value_error(messages, data):
    n, hello, report = messages
    doc, num_tasks = data.draw(st.sampled_from([(hello, None), (report, n)]))
    path = [data.draw(st.sampled_from(sorted(doc)))]
    inner = doc[path[0]]
    if isinstance(inner, dict):
        path.append(data.draw(st.sampled_from(sorted(inner))))
    changed = json.loads(json.dumps(doc))
    holder = changed if len(path) == 1 else changed[path[0]]
    how = data.draw(st.sampled_from(["drop", "replace", "add"]))
    if how == "drop":
        del holder[path[-1]]
    elif how == "add":
        holder["extra" + data.draw(st.text(max_size=3))] = data.draw(_json_values())
    else:
        holder[path[-1]] = data.draw(_json_values())
    body = json.dumps(changed).encode()
    if how != "replace":
        with pytest.raises(ValueError):           # a field missing, or one unknown
            _reports.decode(body, num_tasks)
        return
    try:
        decoded = _reports.decode(body, num_tasks)
    except ValueError:
        return
    # A replacement the schema takes (a value of the field's kind and range)
    # comes back as given, and encodes again.
    got = decoded if len(path) == 1 else decoded[path[0]]
    assert got[path[-1]] == holder[path[-1]]
    assert _reports.decode(_reports.encode(decoded)[4:], num_tasks) == decoded


@given(st.binary(max_size=300), st.one_of(st.none(), st.integers(1, 4)))
def test_any_bytes_decode_or_raise_a_value_error(body, num_tasks):
    try:
        _reports.decode(body, num_tasks)
    except ValueError:
        pass


def test_deeply_nested_and_non_finite_json_are_refused():
    for body in (b"[" * 50_000 + b"]" * 50_000, b'{"type": "hello", "version": NaN}',
                 b'{"a": Infinity}', b"\xff\xfe", b"", b"null"):
        with pytest.raises(ValueError):
            _reports.decode(body, None)
    with pytest.raises(ValueError, match="at most"):
        _reports.decode(b" " * (_reports.MAX_MESSAGE + 1), None)


_METRIC_NAME = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True)
_LABEL_NAME = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True).filter(
    lambda s: not s.startswith("__"))
_VALUE = st.one_of(st.integers(-2 ** 64, 2 ** 64), st.floats())


@given(st.lists(st.tuples(
    _METRIC_NAME, st.sampled_from(_prometheus.TYPES), st.text(max_size=30),
    st.lists(st.tuples(st.dictionaries(_LABEL_NAME, st.text(max_size=12), max_size=3),
                       _VALUE), max_size=4)),
    max_size=5, unique_by=lambda f: f[0]))
def test_the_exposition_reads_back_as_written(families):
    text = _prometheus.format_families(families)
    parsed = parse_prometheus(text)
    assert list(parsed) == [f[0] for f in families]
    for name, kind, help_text, samples in families:
        got_kind, got_help, got_samples = parsed[name]
        assert (got_kind, got_help) == (kind, help_text)
        assert len(got_samples) == len(samples)
        for (labels, value), (got_labels, got_value) in zip(samples, got_samples):
            assert got_labels == labels
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(got_value)
            else:
                assert got_value == value


def test_the_exposition_refuses_names_the_format_does_not_allow():
    for families in ([("1bad", "gauge", "", [])], [("ok", "summary", "", [])],
                     [("ok", "gauge", "", [({"__reserved": "x"}, 1)])],
                     [("ok", "gauge", "", [({"bad-label": "x"}, 1)])],
                     [("a", "gauge", "", []), ("a", "gauge", "", [])]):
        with pytest.raises(ValueError):
            _prometheus.format_families(families)


# ---- flinkbuf monitor ---------------------------------------------------------------------------

def _cli(*args, timeout=60):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NO_COLOR", None)
    return subprocess.run([sys.executable, "-m", "flinkbuf", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_monitor_shows_the_view_in_a_terminal(view, nbp, monkeypatch):
    target = view._target("exchange-d", "pipelined_exchange of RDD 4 into count", 1)
    local = LocalTask(nbp, records=1000)
    reporter = target.start(local.task, Ctx(attempt=21))
    local.run()
    reporter.stop(None)
    wait_for(lambda: view.snapshot()["exchanges"][0]["state"] == "FINISHED", 10, "the end")
    proc = _cli("monitor", view.url.replace("http://", ""), "--count", "2", "--interval", "0.1")
    assert proc.returncode == 0, proc.stderr
    frames = proc.stdout.split("flinkbuf live view ")
    assert len(frames) == 3 and "\x1b[" not in proc.stdout    # no terminal: plain frames
    frame = frames[-1]
    assert "pipelined_exchange of RDD 4 into count  FINISHED" in frame
    row = next(line for line in frame.splitlines() if " FINISHED " in line
               and line.split()[0] == "0")
    assert row.split()[1:3] == ["21", "FINISHED"]
    # In place on a terminal, the levels in Flink's colours.
    from flinkbuf.spark import live_text

    class Terminal:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return True

        def write(self, text):
            self.text += text

        def flush(self):
            pass

    out = Terminal()
    monkeypatch.setenv("COLUMNS", "200")      # a terminal wide enough for every column
    assert live_text.watch(view.url, interval=0.05, count=2, out=out) == 2
    assert out.text.count("\x1b[H\x1b[J") == 2
    assert "48;2;82;196;26m" in out.text or "48;2;245;34;45m" in out.text \
        or "48;2;250;173;20m" in out.text
    local.close()


def test_monitor_says_why_when_it_cannot_show_the_view(view):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]              # nothing listens there once closed
    proc = _cli("monitor", f"127.0.0.1:{port}", "--timeout", "2")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "cannot reach the live view" in proc.stderr
    assert "Connection refused" in proc.stderr
    proc = _cli("monitor", view.url + "nothing/", "--count", "1")
    assert proc.returncode == 1 and "answered HTTP 404" in proc.stderr
    proc = _cli("monitor", "ftp://host:1")
    assert proc.returncode == 2 and "must start with http://" in proc.stderr
    with pytest.raises(RemoteConnectionError, match="not a flinkbuf live view"):
        from flinkbuf.spark import live_text
        import http.server

        class NotAView(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = b'{"exchanges": []}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.HTTPServer(("127.0.0.1", 0), NotAView)
        thread = threading.Thread(target=server.handle_request)
        thread.start()
        try:
            live_text.fetch(f"http://127.0.0.1:{server.server_address[1]}/", 10)
        finally:
            thread.join(10)
            server.server_close()


@given(st.text(max_size=40))
def test_any_address_text_is_a_view_url_or_a_value_error(text):
    from flinkbuf.spark import live, live_text

    try:
        url = live_text.view_url(text)
    except ValueError:
        pass
    else:
        assert url.startswith("http://") and url.endswith("/")
        assert live_text.view_url(url) == url          # read again, the same
    try:
        live.check_option(text)
    except ValueError:
        pass
    else:
        host, port = live._parse_address(text)
        assert 0 <= port <= 65535 and (host is None or isinstance(host, str))


def test_the_terminal_view_names_the_bottleneck():
    from flinkbuf.spark import live_text

    store = _live_store.Store(0.5)
    store.register("ex", "pipelined_exchange of RDD 1 into count", 2)
    metrics = {k: 0 for k in _reports.METRICS}
    for index, idle in ((0, 990.0), (1, 4.0)):
        key = store.hello({"task": index, "attempt": 10 + index, "attempt_number": 0,
                           "stage": 1, "address": "a:1", "num_tasks": 2, "exchange": "ex"}, "p")
        store.report(key, {"type": "report", "elapsed": 1.0, "cpu": 0.0, "seq": 0,
                           "stats": {}, "backlogs": [0, 0],
                           "metrics": dict(metrics, backPressureLevel="HIGH",
                                           backPressuredTimeMsPerSecond=960.0,
                                           softBackPressuredTimeMsPerSecond=10.0,
                                           hardBackPressuredTimeMsPerSecond=950.0,
                                           producerBusyTimeMsPerSecond=40.0,
                                           consumerBusyTimeMsPerSecond=1000.0 - idle,
                                           idleTimeMsPerSecond=idle,
                                           consumerIdleTimeMsPerSecond=idle,
                                           numRecordsInPerSecond=87_000.0, inPoolUsage=0.9,
                                           debloatedBufferSize=2048 + index,
                                           estimatedTimeToConsumeBuffersMs=None,
                                           inputGates=[])})
    text = live_text.render(store.document(), "http://x:1/", width=200)
    assert "bottleneck: task 1 — its consumer waits for input only 4 ms/s" in text
    rows = [line.split() for line in text.splitlines() if "RUNNING" in line and "HIGH" in line]
    assert [r[:3] for r in rows] == [["0", "10", "RUNNING"], ["*", "1", "11"]]
    # bp, soft, hard, producer busy and idle, consumer busy and idle, records in/s
    assert rows[0][4:13] == ["960", "10", "950", "40", "0", "10", "990", "87.0", "k"]
    assert rows[1][-2:] == ["2049", "-"]            # debloated buffer size, time to consume
    assert all(len(line) <= 80 for line in live_text.render(
        store.document(), "http://x:1/", width=80).splitlines())
