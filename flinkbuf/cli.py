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
        description="Producer at 60%% of full speed, consumer slowed to 30%%, released, "
                    "slowed again, released; throughput of both every interval as %% of full "
                    "speed. Writes DIR/backpressure.csv, .json and .png.")
    bp.add_argument("--out", default="out", metavar="DIR", help="output directory (default: out)")
    bp.add_argument("--phase-seconds", type=_positive, default=5.0, metavar="S",
                    help="length of each phase (default: 5)")
    bp.add_argument("--interval", type=_positive, default=0.5, metavar="S",
                    help="sampling interval (default: 0.5)")
    bp.add_argument("--segment-size", type=int, default=4096)
    bp.add_argument("--buffers", type=int, default=2, help="buffers of the producer's pool")
    bp.add_argument("--no-plot", action="store_true", help="skip the PNG")
    bp.set_defaults(func=_run_backpressure)

    ss = which.add_parser(
        "slow-subpartition",
        help="seed 003: a blocked consumer starves its round-robin sibling through a shared "
             "pool, unless the per-channel cap and the backlog-aware rebalance step in",
        description="Modes unimpeded, shared-pool, per-channel-cap, backlog-aware. Writes "
                    "DIR/slow-subpartition.csv, .json and .png.")
    ss.add_argument("--out", default="out", metavar="DIR", help="output directory (default: out)")
    ss.add_argument("--phase-seconds", type=_positive, default=3.0, metavar="S",
                    help="length of each mode's run (default: 3)")
    ss.add_argument("--consumer-rate", type=int, default=50_000,
                    help="records/s each consumer can process (default: 50000)")
    ss.add_argument("--pool-buffers", type=int, default=16)
    ss.add_argument("--cap", type=int, default=6, help="max buffers per subpartition "
                    "in the per-channel-cap mode")
    ss.add_argument("--segment-size", type=int, default=4096)
    ss.add_argument("--no-plot", action="store_true", help="skip the PNG")
    ss.set_defaults(func=_run_slow_subpartition)
    return parser


def _positive(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _run_demo(args):
    from flinkbuf.demo import run_demo
    run_demo(phase_seconds=args.seconds, segment_size=args.segment_size)
    return 0


def _run_backpressure(args):
    from flinkbuf.experiments import run_backpressure
    doc = run_backpressure(args.out, args.phase_seconds, interval=args.interval,
                           segment_size=args.segment_size, buffers=args.buffers,
                           plot=not args.no_plot)
    return 0 if doc["checks"]["tracks_consumer"] else 1


def _run_slow_subpartition(args):
    from flinkbuf.experiments import run_slow_subpartition
    run_slow_subpartition(args.out, args.phase_seconds, consumer_rate=args.consumer_rate,
                          pool_buffers=args.pool_buffers, cap=args.cap,
                          segment_size=args.segment_size, plot=not args.no_plot)
    return 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
