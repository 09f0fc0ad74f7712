"""The ``flinkbuf`` command line: ``flinkbuf demo``, the experiments,
``flinkbuf experiment backpressure``, ``flinkbuf experiment slow-subpartition`` and
``flinkbuf experiment debloat``,
``flinkbuf spark-demo`` (the backpressure schedule on PySpark tasks) and
``flinkbuf monitor URL`` (a live view of a driver's exchanges, in the terminal).

Every argument is checked before anything runs: a bad one (or a missing
requirement, such as PySpark or Java for the Spark demo) is reported on
one line of standard error, with exit status 2, and nothing is written.
A command exits with 1 if one of its expectations does not hold, or if the
run fails (one line saying why, not a traceback), and with 130, after the
one line ``flinkbuf: interrupted``, on Ctrl-C.
"""

import argparse
import contextlib
import os
import re
import signal
import sys
import threading

import flinkbuf
from flinkbuf import demo as _demo
from flinkbuf.experiments import ExperimentArgumentError
from flinkbuf.experiments import backpressure as _bp
from flinkbuf.experiments import debloat as _db
from flinkbuf.experiments import slow_subpartition as _ss
from flinkbuf.experiments.arguments import MAX_SECONDS, MissingRequirementError
from flinkbuf.experiments.failures import one_line
from flinkbuf.experiments.output import PLOT_HINT, prepare_out_dir, remove_empty
from flinkbuf.experiments.remote import TRANSPORTS

# Parameter names of the library functions -> the options that set them.
_OPTION_NAMES = {
    "out_dir": "--out",
    "phase_seconds": "--phase-seconds",
    "interval": "--interval",
    "full_speed": "--full-speed",
    "full_speed_fraction": "--full-speed-fraction",
    "segment_size": "--segment-size",
    "buffers": "--buffers",
    "consumer_rate": "--consumer-rate",
    "pool_buffers": "--pool-buffers",
    "cap": "--cap",
    "modes": "--modes",
    "tasks": "--tasks",
    "records": "--records",
    "master": "--master",
    "transport": "--transport",
    "remote": "--remote",
    "count": "--count",
    "timeout": "--timeout",
    "live_view": "--live-view",
    "target": "--target",
    "period": "--period",
    "samples": "--samples",
}
_DEMO_NAMES = {"phase_seconds": "--seconds", "segment_size": "--segment-size"}


class _Parser(argparse.ArgumentParser):
    """Errors on one line (no usage block), exit status 2.  Negative numbers
    in any notation (``-1e3``, ``-inf``) are option values, not options, so
    that they get the range check's message."""

    _NEGATIVE_NUMBER = re.compile(
        r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = self._NEGATIVE_NUMBER

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(str(message).split())} "
                     f"(see {self.prog} --help)\n")


def _number(text):
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def _integer(text):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _modes(text):
    if text.strip() == "all":
        return list(_ss.MODES)
    return [m.strip() for m in text.split(",") if m.strip()]


def build_parser():
    parser = _Parser(
        prog="flinkbuf", description="Flink's network buffers and backpressure for Python.",
        epilog="Bad arguments are reported on one line with exit status 2, before anything "
               "runs or is written; a command whose expectations do not hold, or whose run "
               "fails, exits with 1; Ctrl-C exits with 130.")
    parser.add_argument("--version", action="version", version=f"flinkbuf {flinkbuf.__version__}")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{demo,experiment,spark-demo,monitor}")
    _add_demo(sub)
    exp = sub.add_parser(
        "experiment", help="the experiments (CSV, JSON and, with matplotlib, a PNG figure)",
        description="The experiments. Each writes a CSV table and a JSON document to --out, "
                    f"and a PNG figure when matplotlib is installed ({PLOT_HINT}).")
    which = exp.add_subparsers(dest="experiment", required=True,
                               metavar="{backpressure,slow-subpartition,debloat}")
    _add_backpressure(which)
    _add_slow_subpartition(which)
    _add_debloat(which)
    _add_spark_demo(sub)
    _add_monitor(sub)
    return parser


def _add_monitor(sub):
    mon = sub.add_parser(
        "monitor",
        help="the live view of a Spark driver's exchanges in this terminal: each task's "
             "backpressure, refreshed in place, and the bottleneck named",
        description=(
            "Shows the live view that a Spark driver serves for its flinkbuf exchanges "
            "(flinkbuf.spark.live_view, or live_view= of an exchange; the spark-demo "
            "command prints its URL) in this terminal, refreshed in place: per exchange and "
            "task, the backpressure level (OK, LOW, HIGH), backpressured, idle and busy ms "
            "per second, records and bytes in and out per second, pool and buffer usage, and "
            "the bottleneck. For a driver on another host, forward its port first, e.g. "
            "ssh -L 4050:127.0.0.1:4050 DRIVER, then flinkbuf monitor localhost:4050. Runs "
            "until Ctrl-C or --count refreshes; exits with 1 (one line saying why) when the "
            "view cannot be reached, or stops answering for --timeout seconds."))
    mon.add_argument("url", metavar="URL",
                     help="the live view's address: http://HOST:PORT/ (or HOST:PORT)")
    mon.add_argument("--interval", type=_number, default=1.0, metavar="S",
                     help="seconds between refreshes, in [0.1, 60] (default: 1)")
    mon.add_argument("--count", type=_integer, default=None, metavar="N",
                     help="stop after N refreshes, N >= 1 (default: until Ctrl-C)")
    mon.add_argument("--timeout", type=_number, default=5.0, metavar="S",
                     help="seconds to wait for the view's answer, in [0.1, 300] (default: 5)")
    mon.set_defaults(func=_run_monitor, parser=mon)


def _add_spark_demo(sub):
    sd = sub.add_parser(
        "spark-demo",
        help="PySpark tasks exchange records through flinkbuf under Flink's backpressure "
             "schedule, then the same keyed job beside Spark's shuffle (needs the spark extra "
             "and Java)",
        description=(
            "A PySpark job (local mode by default) whose tasks exchange (key, value) records "
            "through flinkbuf, hashed by key (flinkbuf.spark.pipelined_exchange). The "
            "producers run at 60 % of full speed, the consumers are slowed to 30 %, released, "
            "slowed and released; a line per interval shows both throughputs (summed over the "
            "tasks), the producers' backpressure level and the records' p99 sojourn (read "
            "time minus emit time, sampled without changing the records); meanwhile the driver serves a live "
            "view of the tasks (a page that names the bottleneck, JSON, Prometheus text) and "
            "prints its URL. Then a table of each task's metrics, and the keyed job (--records records counted per key) through flinkbuf "
            "and through Spark's shuffle, side by side. With --connect, the same as a Spark "
            "Connect client of a server it starts (the records as Arrow batches, through "
            "flinkbuf.spark.arrow_exchange). Writes DIR/spark-backpressure.csv, "
            ".json, with matplotlib .png, and .log (what Spark's JVM and its Python workers "
            "print, kept off the terminal); exits with 1 if an expectation fails or the run "
            "fails (one line with the cause). Needs PySpark (pip install 'flinkbuf[spark]') "
            "and a Java runtime ($JAVA_HOME/bin/java, else java on PATH; Java 17 or later for "
            "Spark 4), checked before Spark starts; the executors run this Python "
            "(PYSPARK_PYTHON, set to it unless already set)."))
    sd.add_argument("--out", default="out", metavar="DIR",
                    help="output directory, created if missing (default: out)")
    sd.add_argument("--phase-seconds", type=_number, default=4.0, metavar="S",
                    help=f"length of each of the 5 phases, up to {MAX_SECONDS:g}, and at least "
                         f"{_bp.SETTLE_SECONDS:g} s (left out of the checks after each change) "
                         "and an interval more (default: 4)")
    sd.add_argument("--interval", type=_number, default=0.5, metavar="S",
                    help="sampling interval, in [0.05, 10] (default: 0.5)")
    sd.add_argument("--tasks", type=_integer, default=2, metavar="N",
                    help="Spark tasks, each a producer and a consumer, in [1, 64]; they run as "
                         "one barrier stage, so the master needs N slots at once (default: 2)")
    sd.add_argument("--records", type=_integer, default=1_000_000, metavar="N",
                    help="records of the keyed job run through flinkbuf and through Spark's "
                         "shuffle, in [1, 1000000000] (default: 1000000)")
    sd.add_argument("--segment-size", type=_integer, default=4096, metavar="BYTES",
                    help="buffer size during the schedule, in [64, 1048576] (default: 4096)")
    sd.add_argument("--full-speed-fraction", type=_number, default=0.25, metavar="F",
                    help="full speed = F x the unthrottled rate, F in [0.01, 1] (default: 0.25)")
    sd.add_argument("--master", default="local[2]", metavar="URL",
                    help="Spark master URL: local (1 slot), local[N] (N), local[*] (a slot per "
                         "CPU), local[N,F], local-cluster[W,C,M] (W x C), spark://HOST:PORT, "
                         "yarn or k8s://URL; where the URL gives the slots, --tasks is checked "
                         "against them before Spark starts (default: local[2])")
    sd.add_argument("--live-view", default="127.0.0.1:0", metavar="HOST:PORT",
                    help="where the driver serves the live view of the exchanges while the demo "
                         "runs (its URL is printed; port 0: any free one; a host other than "
                         "loopback serves it to other machines) (default: 127.0.0.1:0)")
    sd.add_argument("--connect", action="store_true",
                    help="run the demo through a Spark Connect server that it starts on "
                         "loopback (on --master), as a Spark Connect client: Connect has no "
                         "RDDs, so the tasks exchange the same records as Arrow batches "
                         "(flinkbuf.spark.arrow_exchange) and the keyed job runs over a "
                         "DataFrame, beside repartition + mapInArrow; needs Spark Connect's "
                         "client packages (in the spark extra)")
    sd.add_argument("--no-live-view", action="store_true", help="serve no live view")
    sd.add_argument("--no-plot", action="store_true", help="skip the PNG")
    sd.set_defaults(func=_run_spark_demo, parser=sd)


def _add_demo(sub):
    demo = sub.add_parser(
        "demo", help="backpressure between two threads through a pool of 2 buffers",
        description="The buffer core alone: a producer thread fills buffers from a pool of 2 "
                    "and a consumer thread recycles them; the consumer runs at full speed, "
                    f"slowed ({_demo.SLOW_DELAY * 1e3:g} ms per buffer) and released, a line "
                    "per phase. The verdict comes from the measured rates: whether the "
                    "producer followed the slowed consumer because its buffer requests "
                    "blocked, or what the measurement could not show. Exits with 1 unless it "
                    "showed that.")
    demo.add_argument("--seconds", type=_number, default=1.0, metavar="S",
                      help=f"length of each of the 3 phases, in [{_demo.MIN_PHASE_SECONDS:g}, "
                           f"{MAX_SECONDS:g}]: a shorter phase holds too few buffers of the "
                           f"slowed consumer (at most {1 / _demo.SLOW_DELAY:,.0f} per second) "
                           "for a rate (default: 1)")
    demo.add_argument("--segment-size", type=_integer, default=4096, metavar="BYTES",
                      help=f"buffer size, in [1, {_demo.MAX_SEGMENT_SIZE}]: filling a larger "
                           "buffer takes about as long as the slowed consumer's delay "
                           "(default: 4096)")
    demo.set_defaults(func=_run_demo, parser=demo)


def _add_backpressure(which):
    bp = which.add_parser(
        "backpressure",
        help="Flink's 2015 backpressure experiment: a producer follows a consumer that is "
             "slowed and released, through 2 buffers of 4096 bytes",
        description=(
            "Flink's 2015 backpressure experiment (the blog post \"How Apache Flink handles "
            "backpressure\"). One producer and one consumer task exchange records through a "
            "pool of 2 buffers of 4096 bytes (--buffers, --segment-size). Phases of "
            "(producer, consumer) speed in % of full speed: (60, 100) -> (60, 30) -> "
            "(100, 100) -> (100, 30) -> (100, 100); only the blocking buffer request makes "
            "the producer follow the slowed consumer. Every interval, a line with both "
            "tasks' throughput and the producer's backpressure level (OK/LOW/HIGH). Full "
            "speed is measured first: a quarter of the rate of the unthrottled pipeline, so "
            "that the tasks hold it while other processes share the CPU (a consumer at 100 % "
            "is not slowed at all). Writes DIR/backpressure.csv (one row per interval), .json "
            "(configuration, calibration, rows, checks) and, with matplotlib, .png; exits "
            "with 1 if an expectation fails."))
    bp.add_argument("--out", default="out", metavar="DIR",
                    help="output directory, created if missing (default: out)")
    bp.add_argument("--phase-seconds", type=_number, default=5.0, metavar="S",
                    help=f"length of each of the 5 phases, up to {MAX_SECONDS:g}, and at least "
                         f"{_bp.SETTLE_SECONDS:g} s (left out of the checks after each change) "
                         "and an interval more (default: 5)")
    bp.add_argument("--interval", type=_number, default=0.5, metavar="S",
                    help=f"sampling interval, in [{_bp.MIN_INTERVAL:g}, --phase-seconds] "
                         "(default: 0.5)")
    bp.add_argument("--full-speed-fraction", type=_number, default=0.25, metavar="F",
                    help=f"full speed = F x the unthrottled pipeline's rate, F in "
                         f"[{_bp.MIN_FULL_SPEED_FRACTION:g}, 1] (default: 0.25; 1 = the "
                         "unthrottled rate itself, which other load on the machine shows as "
                         "noise)")
    bp.add_argument("--full-speed", type=_number, default=None, metavar="RECORDS_PER_S",
                    help="full speed in records/s, instead of measuring it; at least "
                         f"{_bp.min_full_speed(0.5):,} with intervals of 0.5 s (a batch of "
                         f"{_bp._BATCH} records per interval at 30 %%)")
    bp.add_argument("--segment-size", type=_integer, default=4096, metavar="BYTES",
                    help="buffer size, >= 1 (default: 4096)")
    bp.add_argument("--buffers", type=_integer, default=2, metavar="N",
                    help=f"buffers of the producer's pool, >= {_bp.MIN_BUFFERS}: one being "
                         "filled, one in flight (default: 2)")
    bp.add_argument("--remote", action="store_true",
                    help="run the consumer in another process, reading over a local "
                         "connection (shared memory, or the --transport named) with "
                         "credit-based flow control (--buffers exclusive buffers); the output "
                         "says which transport the connection used")
    _add_transport(bp)
    bp.add_argument("--no-plot", action="store_true", help="skip the PNG")
    bp.set_defaults(func=_run_backpressure, parser=bp)


def _add_slow_subpartition(which):
    ss = which.add_parser(
        "slow-subpartition",
        help="one slow subpartition: a blocked consumer starves its round-robin sibling "
             "through a shared pool, unless the backlog-aware round robin steps in",
        description=(
            "A producer feeds two consumers through one shared output pool; consumer 0 is "
            "blocked. Modes (--modes): unimpeded (round robin, nobody blocked: the "
            "reference); shared-pool (round robin: the fast consumer starves, expected at "
            f"most {_ss.STARVED_MAX:.0%} of the reference); per-channel-cap-only (round robin "
            "with the per-channel cap: the blocked subpartition holds at most --cap buffers, "
            "but round robin still waits for it, so the fast consumer still starves; not run "
            "by default); per-channel-cap (the cap together with the backlog-aware "
            "round robin, which keeps the blocked subpartition under its cap: throughput "
            f"restored, expected at least {_ss.RESTORED_MIN:.0%}); backlog-aware (the "
            f"backlog-aware round robin alone: restored, at least {_ss.RESTORED_MIN:.0%}). "
            "Writes DIR/slow-subpartition.csv, .json and, with matplotlib, .png; exits with "
            "1 if an expectation fails."))
    ss.add_argument("--out", default="out", metavar="DIR",
                    help="output directory, created if missing (default: out)")
    ss.add_argument("--phase-seconds", type=_number, default=3.0, metavar="S",
                    help=f"length of each mode's run, in (0, {MAX_SECONDS:g}] (default: 3)")
    ss.add_argument("--consumer-rate", type=_integer, default=50_000, metavar="RECORDS_PER_S",
                    help=f"records/s each consumer can process, at most "
                         f"{_ss.MAX_CONSUMER_RATE:,}, and at least {_ss._BATCH} (more for "
                         f"runs under 1.5 s: a batch of {_ss._BATCH} records must fit the "
                         "measured part of each run) (default: 50000)")
    ss.add_argument("--pool-buffers", type=_integer, default=16, metavar="N",
                    help=f"buffers of the shared output pool, >= {_ss.MIN_POOL_BUFFERS} "
                         "(default: 16)")
    ss.add_argument("--cap", type=_integer, default=6, metavar="N",
                    help="max buffers per subpartition in the per-channel-cap modes, in "
                         "[1, --pool-buffers] (default: 6)")
    ss.add_argument("--segment-size", type=_integer, default=4096, metavar="BYTES",
                    help="buffer size, >= 1 (default: 4096)")
    ss.add_argument("--modes", type=_modes, default=list(_ss.DEFAULT_MODES), metavar="LIST",
                    help=f"comma-separated modes to run, in order, or 'all' "
                         f"({','.join(_ss.MODES)}); default: {','.join(_ss.DEFAULT_MODES)}")
    ss.add_argument("--remote", action="store_true",
                    help="run both consumers in another process, reading over a local "
                         "connection (shared memory, or the --transport named); the output "
                         "says which transport the connection used")
    _add_transport(ss)
    ss.add_argument("--no-plot", action="store_true", help="skip the PNG")
    ss.set_defaults(func=_run_slow_subpartition, parser=ss)


def _add_debloat(which):
    db = which.add_parser(
        "debloat",
        help="buffer debloating off and on under the backpressure schedule: records' sojourn "
             "time, throughput and the data in flight",
        description=(
            "Buffer debloating (Flink's FLIP-183) under the backpressure schedule, off and on. "
            "A producer and a consumer task exchange timestamped records through --buffers "
            "buffers of --segment-size bytes; the producer runs at 60 % of full speed, the "
            "consumer is not slowed, then slowed to 30 %, released (both at 100 %), slowed "
            "and released. The schedule runs twice, debloating off and then on (--target "
            "seconds of data in flight, a sample every --period seconds, smoothed over "
            "--samples). Every --interval, a line with the consumer's throughput, the p50 and "
            "p99 sojourn of the records read (read time minus emit time), the bytes in "
            "flight, the debloated buffer size and the segments handed back to the network "
            "pools; at the end a table per phase, off vs on. Writes DIR/debloat.csv (a row per "
            "interval and run), .json and, with matplotlib, .png; exits with 1 if an "
            "expectation fails (a lower p99 sojourn with debloating while the consumer is "
            "slowed, the throughput kept, no buffer lost)."))
    db.add_argument("--out", default="out", metavar="DIR",
                    help="output directory, created if missing (default: out)")
    db.add_argument("--phase-seconds", type=_number, default=None, metavar="S",
                    help=f"length of each of the 5 phases, up to {MAX_SECONDS:g}, and at least "
                         f"twice --interval (default: {_db.DEFAULT_PHASE_SECONDS:g})")
    db.add_argument("--quick", action="store_true",
                    help=f"phases of {_db.QUICK_PHASE_SECONDS:g} s (a smoke run of about 20 s)")
    db.add_argument("--interval", type=_number, default=0.1, metavar="S",
                    help=f"sampling interval, in [{_bp.MIN_INTERVAL:g}, 10] (default: 0.1)")
    db.add_argument("--segment-size", type=_integer, default=32768, metavar="BYTES",
                    help="segment size, the largest buffer, in [1024, 1048576] (default: 32768)")
    db.add_argument("--buffers", type=_integer, default=16, metavar="N",
                    help=f"buffers of the producer's pool (and, with --remote, the consumer's "
                         f"exclusive buffers), in [{_db.MIN_BUFFERS}, 4096] (default: 16)")
    db.add_argument("--target", type=_number, default=0.1, metavar="S",
                    help="debloating's target: seconds of data in flight toward the consumer, "
                         "in (0, 60] (default: 0.1)")
    db.add_argument("--period", type=_number, default=0.05, metavar="S",
                    help="seconds between two samples of the consumer's gate, in [0.001, 10] "
                         "(default: 0.05)")
    db.add_argument("--samples", type=_integer, default=10, metavar="N",
                    help="samples the buffer size is smoothed over, in [1, 1000] (default: 10)")
    db.add_argument("--full-speed-fraction", type=_number, default=0.25, metavar="F",
                    help=f"full speed = F x the unthrottled rate without debloating, F in "
                         f"[{_bp.MIN_FULL_SPEED_FRACTION:g}, 1] (default: 0.25)")
    db.add_argument("--remote", action="store_true",
                    help="run the consumer in another process, reading over a local "
                         "connection (shared memory, or the --transport named) with "
                         "credit-based flow control (--buffers exclusive buffers)")
    _add_transport(db)
    db.add_argument("--no-plot", action="store_true", help="skip the PNG")
    db.set_defaults(func=_run_debloat, parser=db)


def _add_transport(parser):
    parser.add_argument("--transport", choices=TRANSPORTS, default="auto",
                        help="with --remote: auto (the fastest between processes on this "
                             "host: shared memory where there is one), shm (shared memory), "
                             "unix (a Unix socket) or tcp (TCP on loopback) (default: auto)")


# Each command checks everything it can (arguments, then what it needs
# installed) before _out_dir creates or writes anything.

@contextlib.contextmanager
def _out_dir(path, filenames):
    """``path`` made ready for ``filenames``; the directories made for it
    are removed again if the run ends before writing anything there."""
    created = []
    prepare_out_dir(path, filenames, names=_OPTION_NAMES, created=created)
    try:
        yield
    except BaseException:
        remove_empty(created)
        raise


def _run_demo(args):
    _demo.check_arguments(args.seconds, args.segment_size, names=_DEMO_NAMES)
    result = _demo.run_demo(phase_seconds=args.seconds, segment_size=args.segment_size)
    return 0 if result["followed"] else 1


def _run_backpressure(args):
    _bp.check_arguments(args.phase_seconds, args.interval, _bp.DEFAULT_SCHEDULE,
                        args.segment_size, args.buffers, args.full_speed,
                        args.full_speed_fraction, remote=args.remote, transport=args.transport,
                        names=_OPTION_NAMES)
    with _out_dir(args.out, _bp.OUTPUT_FILES):
        doc = _bp.run_backpressure(args.out, args.phase_seconds, interval=args.interval,
                                   segment_size=args.segment_size, buffers=args.buffers,
                                   full_speed=args.full_speed,
                                   full_speed_fraction=args.full_speed_fraction,
                                   remote=args.remote, transport=args.transport,
                                   plot=not args.no_plot)
    return 0 if doc["checks"]["passed"] else 1


def _run_slow_subpartition(args):
    _ss.check_arguments(args.phase_seconds, args.consumer_rate, args.segment_size,
                        args.pool_buffers, args.cap, args.modes, remote=args.remote,
                        transport=args.transport, names=_OPTION_NAMES)
    with _out_dir(args.out, _ss.OUTPUT_FILES):
        doc = _ss.run_slow_subpartition(args.out, args.phase_seconds,
                                        consumer_rate=args.consumer_rate,
                                        pool_buffers=args.pool_buffers, cap=args.cap,
                                        segment_size=args.segment_size, modes=args.modes,
                                        remote=args.remote, transport=args.transport,
                                        plot=not args.no_plot)
    return 0 if doc["checks"]["passed"] else 1


def _run_debloat(args):
    from flinkbuf.experiments.arguments import fail
    if args.quick and args.phase_seconds is not None:
        fail("--quick sets --phase-seconds: give one of them")
    phase = args.phase_seconds
    if phase is None:
        phase = _db.QUICK_PHASE_SECONDS if args.quick else _db.DEFAULT_PHASE_SECONDS
    kw = dict(interval=args.interval, segment_size=args.segment_size, buffers=args.buffers,
              target=args.target, period=args.period, samples=args.samples,
              full_speed_fraction=args.full_speed_fraction, remote=args.remote,
              transport=args.transport)
    _db.check_arguments(phase, names=_OPTION_NAMES, **kw)
    with _out_dir(args.out, _db.OUTPUT_FILES):
        doc = _db.run_debloat(args.out, phase, plot=not args.no_plot, **kw)
    return 0 if doc["checks"]["passed"] else 1


def _run_spark_demo(args):
    from flinkbuf.experiments import spark_demo as _sd
    from flinkbuf.experiments import spark_launcher
    live_view = None if args.no_live_view else args.live_view
    _sd.check_arguments(args.phase_seconds, args.interval, args.tasks, args.records,
                        args.segment_size, args.full_speed_fraction, args.master,
                        live_view=live_view, names=_OPTION_NAMES)
    spark_launcher.check_environment(args.master, connect=args.connect, names=_OPTION_NAMES)
    with _out_dir(args.out, _sd.OUTPUT_FILES):
        doc = _sd.run_spark_demo(args.out, args.phase_seconds, interval=args.interval,
                                 tasks=args.tasks, records=args.records,
                                 segment_size=args.segment_size,
                                 full_speed_fraction=args.full_speed_fraction,
                                 master=args.master, connect=args.connect,
                                 plot=not args.no_plot, live_view=live_view)
    return 0 if doc["checks"]["passed"] else 1


def _run_monitor(args):
    from flinkbuf.experiments.arguments import check_int, check_real, fail
    from flinkbuf.spark import live_text

    try:
        live_text.view_url(args.url)
    except ValueError as exc:
        fail(exc)
    check_real("interval", args.interval, ge=0.1, le=60.0, names=_OPTION_NAMES)
    if args.count is not None:
        check_int("count", args.count, ge=1, names=_OPTION_NAMES)
    check_real("timeout", args.timeout, ge=0.1, le=300.0, names=_OPTION_NAMES)
    live_text.watch(args.url, interval=args.interval, count=args.count, timeout=args.timeout)
    return 0


INTERRUPTED = "flinkbuf: interrupted"


class _Interrupts:
    """Ctrl-C while a command runs: the first prints ``flinkbuf:
    interrupted``, silences standard error for the rest of the process (a
    command stopping its threads, its child processes or Spark has nothing
    more to say) and raises KeyboardInterrupt, so that the command cleans
    up on its way out; a second one exits at once."""

    def __init__(self):
        self.fired = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False

    def _handler(self, signum, frame):
        if self.fired:
            try:
                sys.stdout.flush()
            finally:
                os._exit(130)
        self.announce()
        raise KeyboardInterrupt

    def announce(self):
        """Say it once, then keep what follows off the terminal."""
        if self.fired:
            return
        self.fired = True
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        print(INTERRUPTED, file=sys.stderr, flush=True)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            sys.stderr = open(os.devnull, "w")


def _quiet_stdout():
    """Standard output to /dev/null: its reader has gone, and the flush at
    exit would fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def main(argv=None):
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns
    the exit status.  After Ctrl-C, standard error stays silent until the
    process exits."""
    parser = build_parser()
    command = parser
    with _Interrupts() as interrupts:
        try:
            args = parser.parse_args(argv)
            command = args.parser
            status = args.func(args)
            # Ctrl-C whose KeyboardInterrupt some code swallowed (raised in a
            # finalizer, or caught by a library): still an interrupted run.
            return 130 if interrupts.fired else status
        except ExperimentArgumentError as exc:
            command.error(str(exc))
        except MissingRequirementError as exc:
            command.exit(2, f"{command.prog}: error: {exc}\n")
        except KeyboardInterrupt:
            interrupts.announce()
            return 130
        except BrokenPipeError:          # the reader of the output went away (| head)
            _quiet_stdout()
            return 141
        except Exception as exc:         # noqa: BLE001 - one line instead of a traceback
            if interrupts.fired:         # cleaning up after Ctrl-C failed
                return 130
            print(f"{command.prog}: failed: {one_line(exc)}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
