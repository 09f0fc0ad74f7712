"""PNG figures of the experiments (matplotlib, Agg backend: no display needed)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

PRODUCER_COLOR = "#e6a817"   # the blog's yellow
CONSUMER_COLOR = "#3a9d3a"   # and green


def plot_backpressure(rows, doc, path):
    """Throughput of producer and consumer over time, in % of full speed,
    with the phases shaded and labelled by their limits (the blog's figure)."""
    interval = doc["config"]["interval_seconds"]
    t = [r["t_seconds"] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=110)
    # phases: runs of equal limits
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or (rows[i]["producer_limit_pct"], rows[i]["consumer_limit_pct"]) != \
                (rows[start]["producer_limit_pct"], rows[start]["consumer_limit_pct"]):
            x0 = rows[start]["t_seconds"] - interval
            x1 = rows[i - 1]["t_seconds"]
            p, c = rows[start]["producer_limit_pct"], rows[start]["consumer_limit_pct"]
            slowed = c < p
            ax.axvspan(x0, x1, color="#d9534f" if slowed else "#5bc0de",
                       alpha=0.10 if slowed else 0.05, lw=0)
            if start:
                ax.axvline(x0, color="grey", lw=0.8, ls=":")
            ax.text((x0 + x1) / 2, 112, f"producer {p}%\nconsumer {c}%", ha="center",
                    va="center", fontsize=8, color="#444")
            start = i
    # each value is the mean over the interval that ends at its time
    ts = [0.0] + t
    ax.step(ts, [rows[0]["producer_pct"]] + [r["producer_pct"] for r in rows], where="pre",
            color=PRODUCER_COLOR, lw=2.2, label="producer")
    ax.step(ts, [rows[0]["consumer_pct"]] + [r["consumer_pct"] for r in rows], where="pre",
            color=CONSUMER_COLOR, lw=1.6, ls="--", label="consumer")
    ax.set_ylim(0, 125)
    ax.set_xlim(0, t[-1] if t else 1)
    ax.set_xlabel("time [s]")
    ax.set_ylabel("throughput [% of full speed]")
    full = doc["full_speed_records_per_s"]
    cfg = doc["config"]
    ax.set_title(f"Backpressure: {cfg['buffers_per_task']} buffers of {cfg['segment_size']} "
                 f"bytes per task, full speed {full / 1e6:.2f} M records/s", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_slow_subpartition(results, doc, path):
    """Records/s of the fast and the slow consumer per mode (bars)."""
    modes = [r["mode"] for r in results]
    fast = [r["fast_consumer_records_per_s"] for r in results]
    slow = [r["slow_consumer_records_per_s"] for r in results]
    fig, ax = plt.subplots(figsize=(8.5, 4.6), dpi=110)
    x = range(len(modes))
    ax.bar([i - 0.2 for i in x], fast, width=0.4, color=CONSUMER_COLOR, label="fast consumer")
    ax.bar([i + 0.2 for i in x], slow, width=0.4, color="#d9534f", label="consumer 0 (blocked, except unimpeded)")
    base = fast[0] if fast and fast[0] else 1.0
    for i, v in enumerate(fast):
        ax.text(i - 0.2, v + base * 0.02, f"{v / base:.0%}", ha="center", fontsize=9)
    ax.set_xticks(list(x))
    ax.set_xticklabels(modes)
    ax.set_ylabel("records/s")
    cfg = doc["config"]
    ax.set_title(f"One blocked consumer, round-robin producer, shared pool of "
                 f"{cfg['pool_buffers']} x {cfg['segment_size']} B "
                 f"(fast consumer: % of unimpeded)", fontsize=10)
    ax.set_ylim(0, max(fast + slow + [1]) * 1.35)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=9, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
