"""What one task of a W-wide exchange costs: connections, threads, file
descriptors and memory (RSS), for W tasks in W processes on this host.

Each process is a task as ``pipelined_exchange`` runs it, without Spark:
its NetworkEnvironment made by the exchange's own ``start_environment``
with ``pipelined_exchange``'s defaults (32 KiB segments, 2 buffers per
channel, 8 floating, caps sized from W, transport ``auto``), a partition
of W subpartitions registered in it, and one gate reading every task's
partition (its own through a local channel, the W - 1 others' over
connections).  The processes learn each other's addresses from this
script, connect all to all, each writes ``--records`` records to every
subpartition (round robin) and reads its gate to the end; then, with every
connection still open, each reads /proc/self/status (VmRSS, Threads) and
counts /proc/self/fd, and reports them with its connections; the same
figures taken before the environment started (flinkbuf imported) are the
baseline.  The table gives the medians over the W tasks.

``python bench/exchange_width.py --widths 2 4 8 16 32 64 [--records 100]
[--transport auto|tcp|unix|shm]``
"""

import argparse
import inspect
import json
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time

TIMEOUT = 600.0


# ---- one task (a child process) -------------------------------------------------------------

def measure():
    """This process's RSS (MiB), threads and open descriptors now."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return {"rss_mib": int(fields["VmRSS"][0]) / 1024, "threads": int(fields["Threads"][0]),
            "fds": len(os.listdir("/proc/self/fd"))}


def task_spec(n, secret, exchange_id, transport):
    """The spec a task of an ``n``-task ``pipelined_exchange`` with its
    defaults runs with (bound to loopback)."""
    from flinkbuf.spark._spec import check_options, make_spec
    from flinkbuf.spark.exchange import pipelined_exchange
    takes = inspect.signature(check_options).parameters
    defaults = {name: p.default for name, p in
                inspect.signature(pipelined_exchange).parameters.items()
                if name in takes and name != "fn" and p.default is not inspect.Parameter.empty}
    defaults["host"] = "127.0.0.1"
    options = check_options(n, None, **defaults)
    if transport != "auto":
        os.environ["FLINKBUF_NET_TRANSPORT"] = transport
    return make_spec(options, secret=secret, exchange_id=exchange_id)


def run_task(n, index, records, secret, exchange_id, transport):
    from flinkbuf.io import RecordWriter, create_partition, partition_buffers
    from flinkbuf.network.addresses import format_address
    from flinkbuf.spark._task_environment import peer_id, start_environment
    baseline = measure()
    spec = task_spec(n, secret, exchange_id, transport)
    out_buffers = partition_buffers(n, spec.options.buffers_per_channel)
    env = start_environment(spec, n, "127.0.0.1", "127.0.0.1", peer_id(index), out_buffers)
    try:
        partition = create_partition(env.network_buffer_pool, n, min_buffers=out_buffers,
                                     name=f"{exchange_id}-{index}")
        env.register_partition(exchange_id, partition)
        print(json.dumps({"address": format_address(env.advertised_address)}), flush=True)
        addresses = json.loads(sys.stdin.readline())["addresses"]
        gate = env.create_input_gate([(a, exchange_id, index) for a in addresses],
                                     codec=spec.options.codec)

        def produce():
            with RecordWriter(partition, "round_robin", codec=spec.options.codec,
                              buffer_timeout=spec.options.buffer_timeout) as writer:
                for i in range(records * n):
                    writer.emit((index, i))

        producer = threading.Thread(target=produce, name="producer")
        producer.start()
        received = sum(1 for _ in gate)
        producer.join(TIMEOUT)
        connected = measure()
        stats = env.connection_stats()
        print(json.dumps({"baseline": baseline, "connected": connected, "received": received,
                          "connections": len(stats),
                          "transports": sorted({s["transport"] for s in stats}),
                          "pool_mib": env.network_buffer_pool.num_segments
                          * spec.options.segment_size / 2**20}), flush=True)
        partition.wait_consumed(TIMEOUT)
        sys.stdin.readline()                 # every task measured: the end
        gate.close()
    finally:
        env.close()


# ---- the driver (this script) ----------------------------------------------------------------

def run_width(n, records, transport):
    """Start ``n`` tasks, connect them, wait for their figures: one dict per task."""
    secret, exchange_id = secrets.token_hex(32), f"width-{secrets.token_hex(4)}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    os.environ.get("PYTHONPATH")) if p))
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--task", str(n), str(i), str(records), secret,
         exchange_id, transport],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for i in range(n)]
    try:
        addresses = [json.loads(p.stdout.readline())["address"] for p in procs]
        for p in procs:
            p.stdin.write(json.dumps({"addresses": addresses}) + "\n")
            p.stdin.flush()
        results = [json.loads(p.stdout.readline()) for p in procs]
        for p in procs:
            p.stdin.write("end\n")
            p.stdin.flush()
        for p in procs:
            if p.wait(TIMEOUT) != 0:
                raise RuntimeError(f"a task of the {n}-task exchange failed ({p.returncode})")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    want = n * records
    if any(r["received"] != want for r in results):
        raise RuntimeError(f"a task read {[r['received'] for r in results]} records, not {want}")
    return results


def median(results, *path):
    values = []
    for r in results:
        for key in path:
            r = r[key]
        values.append(r)
    return statistics.median(values)


def row(n, results):
    """A table row of the medians of one width: each figure with connections
    open, and in parentheses what it adds to the baseline."""
    from flinkbuf.spark._task_environment import connection_caps

    def grown(key, fmt):
        now = median(results, "connected", key)
        return f"{now:{fmt}} (+{now - median(results, 'baseline', key):{fmt}})"

    caps = connection_caps(n)
    transports = sorted({t for r in results for t in r["transports"]})
    cells = [n, f"{median(results, 'connections'):g}", grown("threads", "g"),
             grown("fds", "g"), grown("rss_mib", ".1f"), f"{median(results, 'pool_mib'):.1f}",
             f"{caps[0]} / {caps[1]}", "/".join(transports) or "-"]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--records", type=int, default=100,
                        help="records each task writes to every subpartition")
    parser.add_argument("--transport", default="auto", choices=("auto", "tcp", "unix", "shm"))
    args = parser.parse_args(argv)
    print("| W | connections | threads (+ the exchange's) | descriptors (+) | RSS MiB (+) "
          "| buffer pool MiB | max_connections / max_pending_handshakes | transport |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.widths:
        started = time.monotonic()
        results = run_width(n, args.records, args.transport)
        print(row(n, results), flush=True)
        print(f"  ({n} tasks in {time.monotonic() - started:.1f} s)", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--task"]:
        n, index, records = (int(v) for v in sys.argv[2:5])
        run_task(n, index, records, bytes.fromhex(sys.argv[5]), sys.argv[6], sys.argv[7])
    else:
        main()
