"""The ``flinkbuf`` command line: ``flinkbuf demo`` and the seeds' experiments,
``flinkbuf experiment backpressure`` and ``flinkbuf experiment slow-subpartition``."""

import argparse
import sys


def build_parser():
    parser = argparse.ArgumentParser(
        prog="flinkbuf", description="Flink's network buffers and backpressure for Python.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo", help="backpressure between two threads through a pool of 2 buffers")
    demo.add_argument("--seconds", type=float, default=1.0, help="length of each phase")
    demo.add_argument("--segment-size", type=int, default=4096)
    demo.set_defaults(func=_run_demo)

    exp = sub.add_parser("experiment", help="the seeds' experiments (CSV, JSON and PNG)")
    which = exp.add_subparsers(dest="experiment", required=True)

    bp = which.add_parser(
        "backpressure",
        help="the 2015 Flink blog post: a producer follows a consumer that is slowed and "
             "released, through 2 buffers of 4096 bytes",
        description=(
            "One producer and one consumer task exchange records through a pool of 2 buffers "
            "of 4096 bytes (--buffers, --segment-size). Phases of (producer, consumer) speed in "
            "% of full speed: (60, 100) -> (60, 30) -> (100, 100) -> (100, 30) -> (100, 100); "
            "only the blocking buffer request makes the producer follow the slowed consumer. "
            "Every interval, a line with both tasks' throughput and the producer's backpressure "
            "level (OK/LOW/HIGH). Full speed is measured first: a quarter of the rate of the "
            "unthrottled pipeline, so that the tasks hold it while other processes share the "
            "CPU (a consumer at 100 % is not slowed at all). Writes DIR/backpressure.csv (one "
            "row per interval), .json (configuration, calibration, rows, checks) and .png; "
            "exits with 1 if an expectation fails."))
    bp.add_argument("--out", default="out", metavar="DIR", help="output directory (default: out)")
    bp.add_argument("--phase-seconds", type=_positive, default=5.0, metavar="S",
                    help="length of each of the 5 phases (default: 5)")
    bp.add_argument("--interval", type=_positive, default=0.5, metavar="S",
                    help="sampling interval (default: 0.5)")
    bp.add_argument("--full-speed-fraction", type=_fraction, default=0.25, metavar="F",
                    help="full speed = F x the unthrottled pipeline's rate (default: 0.25; "
                         "1 = the unthrottled rate itself, which other load on the machine "
                         "shows as noise)")
    bp.add_argument("--full-speed", type=_positive, default=None, metavar="RECORDS_PER_S",
                    help="full speed in records/s, instead of measuring it")
    bp.add_argument("--segment-size", type=_positive_int, default=4096, metavar="BYTES",
                    help="buffer size (default: 4096)")
    bp.add_argument("--buffers", type=_positive_int, default=2, metavar="N",
                    help="buffers of the producer's pool (default: 2)")
    bp.add_argument("--no-plot", action="store_true", help="skip the PNG")
    bp.set_defaults(func=_run_backpressure, parser=bp)

    ss = which.add_parser(
        "slow-subpartition",
        help="seed 003: a blocked consumer starves its round-robin sibling through a shared "
             "pool, unless the per-channel cap and the backlog-aware rebalance step in",
        description="A round-robin producer feeds two consumers through one shared output "
                    "pool; consumer 0 is blocked. Modes: unimpeded (nobody blocked: the "
                    "reference), shared-pool (the fast consumer starves), per-channel-cap and "
                    "backlog-aware (its throughput restored). Writes DIR/slow-subpartition.csv, "
                    ".json and .png; exits with 1 if an expectation fails.")
    ss.add_argument("--out", default="out", metavar="DIR", help="output directory (default: out)")
    ss.add_argument("--phase-seconds", type=_positive, default=3.0, metavar="S",
                    help="length of each mode's run (default: 3)")
    ss.add_argument("--consumer-rate", type=_positive_int, default=50_000, metavar="RECORDS_PER_S",
                    help="records/s each consumer can process (default: 50000)")
    ss.add_argument("--pool-buffers", type=_positive_int, default=16, metavar="N",
                    help="buffers of the shared output pool (default: 16)")
    ss.add_argument("--cap", type=_positive_int, default=6, metavar="N",
                    help="max buffers per subpartition in the per-channel-cap mode (default: 6)")
    ss.add_argument("--segment-size", type=_positive_int, default=4096, metavar="BYTES",
                    help="buffer size (default: 4096)")
    ss.add_argument("--no-plot", action="store_true", help="skip the PNG")
    ss.set_defaults(func=_run_slow_subpartition)
    return parser


def _number(text, kind=float):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def _positive(text):
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_int(text):
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _fraction(text):
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _run_demo(args):
    from flinkbuf.demo import run_demo
    run_demo(phase_seconds=args.seconds, segment_size=args.segment_size)
    return 0


def _run_backpressure(args):
    from flinkbuf.experiments import run_backpressure
    if args.phase_seconds < args.interval:
        args.parser.error(f"--phase-seconds ({args.phase_seconds:g}) must be at least "
                          f"--interval ({args.interval:g})")
    doc = run_backpressure(args.out, args.phase_seconds, interval=args.interval,
                           segment_size=args.segment_size, buffers=args.buffers,
                           full_speed=args.full_speed,
                           full_speed_fraction=args.full_speed_fraction, plot=not args.no_plot)
    return 0 if doc["checks"]["passed"] else 1


def _run_slow_subpartition(args):
    from flinkbuf.experiments import run_slow_subpartition
    doc = run_slow_subpartition(args.out, args.phase_seconds, consumer_rate=args.consumer_rate,
                                pool_buffers=args.pool_buffers, cap=args.cap,
                                segment_size=args.segment_size, plot=not args.no_plot)
    return 0 if doc["checks"]["passed"] else 1


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
