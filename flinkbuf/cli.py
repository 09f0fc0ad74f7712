"""The ``flinkbuf`` command line: ``flinkbuf demo`` and friends."""

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
    return parser


def _run_demo(args):
    from flinkbuf.demo import run_demo
    run_demo(phase_seconds=args.seconds, segment_size=args.segment_size)
    return 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
