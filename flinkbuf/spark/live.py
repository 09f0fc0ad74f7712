"""A live view of the exchanges of a Spark session, served by the driver:
each task's backpressure while the job runs, the bottleneck named, and the
same data as JSON and as Prometheus text (:class:`LiveView`,
:func:`live_view`).

The tasks of an exchange that reports to a view send their metrics to the
driver every ``interval`` seconds, over a connection authenticated with
the view's secret (flinkbuf's handshake, as the exchange's rendezvous),
and a last report when they end; a task whose reports stop without that
last one shows as LOST.  The view serves, on its own address (loopback
unless told otherwise):

``/``          a page that refreshes itself every second: per exchange and
               task, busy / backpressured / idle ms per second, Flink's
               backpressure level (OK / LOW / HIGH in Flink's colours),
               records and bytes in and out per second, pool and buffer
               usage, charts of them over the last two minutes, and the
               bottleneck: the tasks that are busy while the tasks feeding
               them are backpressured;
``/api/view``  the same as JSON (``?since=SEQ``: only the history samples
               after an earlier document's ``seq``);
``/metrics``   Prometheus text: ``flinkbuf_task_<Flink's metric name>``
               with labels ``exchange``, ``task`` and ``attempt``.
"""

import atexit
import logging
import secrets
import socket
import threading
import weakref

from flinkbuf.checks import check_int, check_real
from flinkbuf.spark import _collector, _live_http, _live_store, _reports
from flinkbuf.spark import _session as sessions

__all__ = ["LiveView", "live_view"]

_LOG = logging.getLogger("flinkbuf.spark")
MIN_INTERVAL = 0.05
MAX_INTERVAL = 60.0

# The views of this process that are still open, and each session's.
_LIVE: "weakref.WeakSet[LiveView]" = weakref.WeakSet()
_SESSION_VIEWS: "weakref.WeakKeyDictionary[object, LiveView]" = weakref.WeakKeyDictionary()
_SESSION_LOCK = threading.Lock()
_is_loopback = _live_http.is_loopback


def _url_host(host):
    if host in ("", "0.0.0.0", "::"):
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host


class LiveView:
    """A live view of exchanges: a page, JSON and Prometheus text served
    over HTTP at ``url`` from ``host``:``port`` (loopback and any free port
    by default; a view on loopback answers loopback clients that name a
    loopback address only), fed by the reports of the tasks of every
    exchange given this view (``live_view=`` of
    :func:`~flinkbuf.spark.pipelined_exchange` and
    :func:`~flinkbuf.spark.arrow_exchange`).

    ``interval``: seconds between a task's reports, in [0.05, 60].  The
    tasks reach the view's report server at ``report_host`` (where it
    binds, any free port) under ``report_advertise`` (the address they are
    told; default ``report_host``): :func:`live_view` sets both to the
    driver's address as Spark knows it.  Reports are authenticated with a
    secret made here, which travels to the tasks in the stage's closure, as
    the exchange's own does.

    The page is served by the report server's thread, which never waits
    for a client: a request must arrive within 10 s and its reply be read
    within 30 s, and at most 64 clients are connected (past that the
    oldest goes), so slow or silent clients cannot hold the page or its
    end.  :meth:`close` (idempotent; also the ``with`` block's end, the
    Spark session's end for a view of :func:`live_view`, and the
    interpreter's exit) stops serving and ends the view's thread at once,
    whatever its clients do; tasks still reporting stop reporting and run
    on.  :meth:`snapshot` and :meth:`prometheus`
    give what ``/api/view`` and ``/metrics`` serve."""

    def __init__(self, host="127.0.0.1", port=0, *, interval=0.5, report_host="127.0.0.1",
                 report_advertise=None):
        if not isinstance(host, str):
            raise TypeError(f"host must be a str, got {type(host).__name__}")
        if not host.strip("[]"):
            raise ValueError("host must name an address (0.0.0.0: every address of this "
                             "machine)")
        host = host.strip("[]")
        check_int(port, "port", 0, 65535)
        interval = float(check_real(interval, "interval", ge=MIN_INTERVAL, le=MAX_INTERVAL,
                                    unit="seconds"))
        if not isinstance(report_host, str):
            raise TypeError(f"report_host must be a str, got {type(report_host).__name__}")
        if not report_host.strip("[]"):
            raise ValueError("report_host must name an address")
        report_host = report_host.strip("[]")
        if report_advertise is not None and not isinstance(report_advertise, str):
            raise TypeError(f"report_advertise must be a str or None, got "
                            f"{type(report_advertise).__name__}")
        self.interval = interval
        self.loopback = _is_loopback(host)
        self._secret = secrets.token_bytes(32)
        self._store = _live_store.Store(interval)
        self._session = None
        self._lock = threading.Lock()
        self._closed = False
        self._collector = None
        try:
            page = _live_http.PageServer(host, port, self)
        except OSError as exc:
            raise OSError(exc.errno, f"the live view cannot listen on {host}:{port}: "
                                     f"{exc.strerror or exc}") from None
        self.address = (host, page.address[1])
        self.url = f"http://{_url_host(host)}:{page.address[1]}/"
        try:
            self._collector = _collector.Collector(
                self._store, self._secret, report_host, advertise=report_advertise,
                idle_timeout=max(30.0, 20 * interval), alive=self._session_alive,
                on_dead=self.close, services=[page])
        except BaseException:
            page.release()
            raise
        _LIVE.add(self)
        _LOG.info("flinkbuf live view at %s", self.url)

    @property
    def report_address(self):
        """``(host, port)`` the tasks send their reports to."""
        return self._collector.address

    @property
    def closed(self):
        return self._closed

    @property
    def refused(self):
        """Report connections and messages refused so far (a peer that did
        not prove the secret, a malformed message, an unknown exchange)."""
        return self._collector.refused

    def _session_alive(self):
        session = self._session
        if session is None:
            return True
        handle = session()
        return handle is not None and sessions.is_alive(handle)

    def snapshot(self, since=0):
        """What ``/api/view`` serves, as a dict: every exchange and its
        tasks (their latest metrics and totals, state, the bottleneck),
        and the history samples after ``since`` (the ``seq`` of an earlier
        snapshot; 0: all that is kept)."""
        check_int(since, "since", 0, 2 ** 63 - 1)
        return self._store.document(since, extra={"url": self.url,
                                                  "refused": self.refused})

    def prometheus(self):
        """What ``/metrics`` serves: Prometheus's text format (0.0.4)."""
        return self._store.prometheus(self.refused)

    def close(self):
        """Stop serving and end the view's threads (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._collector is not None:
            self._collector.close()          # its thread ends, closing the page's connections
        _LIVE.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()

    def __repr__(self):
        return f"<flinkbuf.spark.LiveView {self.url} {'closed' if self._closed else 'open'}>"

    # ---- for the exchanges -----------------------------------------------------------------

    def _target(self, exchange_id, name, num_tasks):
        """Register an exchange of ``num_tasks`` tasks; where its tasks report."""
        if self._closed:
            raise ValueError(f"the live view at {self.url} is closed")
        if num_tasks > _reports.MAX_TASKS:
            raise ValueError(f"the live view follows exchanges of up to {_reports.MAX_TASKS} "
                             f"tasks, this one has {num_tasks}")
        cap = self._collector.max_connections
        if num_tasks > cap:
            _LOG.warning("flinkbuf live view: %s has %d tasks, but this process's descriptor "
                         "limit leaves room for %d report connections: the others will not "
                         "show (raise ulimit -n, or its soft limit, to follow every task)",
                         exchange_id, num_tasks, cap)
        self._collector.expect(num_tasks)
        self._store.register(exchange_id, name, num_tasks)
        return _reports.Target(self.report_address, self._secret, exchange_id, num_tasks,
                               self.interval)


LiveView.__module__ = "flinkbuf.spark.live"


def live_view(spark, *, host=None, port=None, interval=None, report_host=None):
    """The live view of the Spark session ``spark`` (a SparkSession, classic
    or Spark Connect, or a SparkContext), started on ``host`` (default
    127.0.0.1: loopback only) and ``port`` (default: any free one) if it
    has none yet; every exchange made in this session afterwards reports
    to it (unless given ``live_view=False``).  Its URL is logged (logger
    ``flinkbuf.spark``, INFO) and is the returned view's ``url``.  It
    closes when the session stops (or with :meth:`LiveView.close`).

    Asking again returns the running view; a ``host``, ``port`` or
    ``interval`` other than the running view's raises ValueError (close
    it first).  Tasks send their reports to the driver's address as Spark
    knows it (``spark.driver.host``, bound on ``spark.driver.bindAddress``),
    as they reach the exchange's rendezvous.  On a Spark Connect session
    the view is served by this client: its tasks report to it where the
    Connect server runs on this machine; when it runs on another,
    ``report_host`` must name an address of this machine that the
    executors reach (a client inside the cluster), else ValueError says
    so (``report_host`` also overrides the address on any session)."""
    session = sessions.session_of(spark)
    if not session.alive():
        raise ValueError("the Spark session has stopped")
    if host is not None and not isinstance(host, str):
        raise TypeError(f"host must be a str or None, got {type(host).__name__}")
    if report_host is not None and not isinstance(report_host, str):
        raise TypeError(f"report_host must be a str or None, got {type(report_host).__name__}")
    if port is not None:
        check_int(port, "port", 0, 65535)
    if interval is not None:
        check_real(interval, "interval", ge=MIN_INTERVAL, le=MAX_INTERVAL, unit="seconds")
    with _SESSION_LOCK:
        view = _SESSION_VIEWS.get(session.key)
        if view is not None and not view.closed:
            asked = []
            if host is not None and host != view.address[0]:
                asked.append(f"host {host}")
            if port and port != view.address[1]:
                asked.append(f"port {port}")
            if interval is not None and float(interval) != view.interval:
                asked.append(f"interval {interval:g}")
            if asked:
                raise ValueError(f"this session's live view runs at {view.url} (interval "
                                 f"{view.interval:g} s); close it to start one with "
                                 f"{', '.join(asked)}")
            return view
        bind, advertised = _report_addresses(session, report_host)
        view = LiveView(host if host is not None else "127.0.0.1", port or 0,
                        interval=0.5 if interval is None else interval,
                        report_host=bind, report_advertise=advertised)
        view._session = weakref.ref(session.key)
        _SESSION_VIEWS[session.key] = view
    return view


def _report_addresses(session, report_host):
    """``(bind, advertised)`` of a session's view's report server."""
    if report_host is not None:
        return report_host.strip("[]"), report_host.strip("[]")
    if session.connect and not session.local:
        raise ValueError(
            f"this Spark Connect session's server runs on {session.server[0]}, so its tasks "
            f"run on other machines and may not reach this client's live view: pass "
            f"report_host= an address of this machine that the executors reach (a client "
            f"inside the cluster), or run the client where the Connect server runs")
    return session.addresses("the live view")


live_view.__module__ = "flinkbuf.spark.live"


def _parse_address(text):
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"live_view must be True, False, None, a port, 'HOST:PORT' or a "
                         f"LiveView, got {text!r}")
    return host.strip("[]") or None, int(port)


def attach(session, option, exchange_id, num_tasks, name):
    """The report target of an exchange (on the driver, when it is made):
    ``option`` is its ``live_view=`` (None: the session's view if one
    runs; False: none; True, a port or ``"HOST:PORT"``: the session's view,
    started there if it has none; a LiveView: that one).  None: the
    exchange does not report."""
    if option is None:
        with _SESSION_LOCK:
            view = _SESSION_VIEWS.get(session.key)
        if view is None or view.closed:
            return None
    elif option is False:
        return None
    elif option is True:
        view = live_view(session.key)
    elif isinstance(option, LiveView):
        view = option
    elif isinstance(option, int) and not isinstance(option, bool):
        view = live_view(session.key, port=option)
    elif isinstance(option, str):
        host, port = _parse_address(option)
        view = live_view(session.key, host=host, port=port)
    else:
        raise TypeError(f"live_view must be True, False, None, a port, 'HOST:PORT' or a "
                        f"LiveView, got {type(option).__name__}")
    master = str(session.master)
    if _is_loopback(view.report_address[0]) and not master.startswith("local"):
        _LOG.warning("flinkbuf live view: its report server listens on %s, which the tasks of "
                     "%s on other hosts cannot reach (make it with live_view(spark), which "
                     "listens on the driver's address)", view.report_address[0], master)
    return view._target(exchange_id, name, num_tasks)


def exchange_name(kind, source, fn):
    """How the view names an exchange: its kind, what it exchanges (an
    RDD's id, or the key column of a DataFrame's rows) and ``fn``'s name."""
    if isinstance(source, str):
        what = f" by {source!r}"
    else:
        try:
            what = f" of RDD {source.id()}"
        except Exception:                  # noqa: BLE001 - only a name
            what = ""
    into = getattr(fn, "__name__", None) if fn is not None else None
    return f"{kind}{what}" + (f" into {into}" if into else "")


def check_option(option):
    """TypeError / ValueError unless ``option`` is a valid ``live_view=``
    (checked before anything starts)."""
    if option is None or isinstance(option, (bool, LiveView)):
        if isinstance(option, LiveView) and option.closed:
            raise ValueError(f"live_view: the view at {option.url} is closed")
        return
    if isinstance(option, int):
        check_int(option, "live_view (a port)", 0, 65535)
        return
    if isinstance(option, str):
        _, port = _parse_address(option)
        check_int(port, "live_view's port", 0, 65535)
        return
    raise TypeError(f"live_view must be True, False, None, a port, 'HOST:PORT' or a "
                    f"LiveView, got {type(option).__name__}")


def close_all():
    """Close every live view of this process that is still open."""
    for view in list(_LIVE):
        view.close()


atexit.register(close_all)
