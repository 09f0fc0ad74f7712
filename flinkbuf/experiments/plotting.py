"""PNG figures of the experiments (matplotlib, Agg backend: no display needed)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

PRODUCER_COLOR = "#e6a817"   # the blog's yellow
CONSUMER_COLOR = "#3a9d3a"   # and green


LEVEL_COLORS = {"OK": "#9bd49b", "LOW": "#f3d27a", "HIGH": "#e8837f"}
# What each level means: the producer's back-pressured ms per second of the interval.
LEVEL_LABELS = {"OK": "OK: blocked <= 100 ms per s of the interval", "LOW": "LOW: <= 500",
                "HIGH": "HIGH: > 500"}


def _phase_spans(rows, interval):
    """(start s, end s, producer %, consumer %) for each run of equal limits."""
    spans, start = [], 0
    for i in range(1, len(rows) + 1):
        key = (rows[start]["producer_limit_pct"], rows[start]["consumer_limit_pct"])
        if i == len(rows) or (rows[i]["producer_limit_pct"], rows[i]["consumer_limit_pct"]) != key:
            spans.append((rows[start]["t_seconds"] - interval, rows[i - 1]["t_seconds"], *key))
            start = i
    return spans


def plot_backpressure(rows, doc, path):
    """Throughput of producer and consumer over time in % of full speed, the
    phases shaded and labelled by their limits (the blog's figure), and the
    producer's back-pressure level in a strip below: each interval's from
    the back-pressured time within exactly that interval, so the strip
    changes with the phases."""
    cfg = doc["config"]
    interval = cfg["interval_seconds"]
    sojourn = any(r.get("sojourn_p99_ms") is not None for r in rows)
    if sojourn:
        fig, (ax, soj, strip) = plt.subplots(
            3, 1, figsize=(10, 7.4), dpi=110, sharex=True,
            gridspec_kw={"height_ratios": [8, 4, 1], "hspace": 0.08})
        _plot_sojourn(soj, rows, interval)
    else:
        fig, (ax, strip) = plt.subplots(
            2, 1, figsize=(10, 5.4), dpi=110, sharex=True,
            gridspec_kw={"height_ratios": [8, 1], "hspace": 0.08})
    top = max([125.0] + [1.2 * max(r["producer_pct"], r["consumer_pct"]) for r in rows])
    for x0, x1, p, c in _phase_spans(rows, interval):
        if c < p:
            ax.axvspan(x0, x1, color="#d9534f", alpha=0.12, lw=0)
        if x0 > 0:
            ax.axvline(x0, color="grey", lw=0.8, ls=":")
        ax.text((x0 + x1) / 2, 0.965, f"producer {p:g} %\nconsumer {c:g} %"
                + ("\n(consumer slowed)" if c < p else ""),
                transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=8,
                color="#444")
    # each value is the mean over one interval: drawn at the interval's middle
    t = [r["t_seconds"] - interval / 2 for r in rows]
    ax.axhline(100, color="#888", lw=0.8, ls="--")
    ax.plot(t, [r["producer_pct"] for r in rows], color=PRODUCER_COLOR, lw=2.6, marker="o",
            ms=4, label="producer")
    ax.plot(t, [r["consumer_pct"] for r in rows], color=CONSUMER_COLOR, lw=1.4, ls="--",
            marker="o", ms=2.5, label="consumer")
    ax.set_ylim(0, top)
    ax.set_ylabel("throughput [% of full speed]")
    full, unthrottled = doc["full_speed_records_per_s"], doc["unthrottled_records_per_s"]
    ax.set_title(f"Backpressure: {cfg['buffers_per_task']} buffers of {cfg['segment_size']} "
                 f"bytes per task; full speed {full / 1e6:.2f} M records/s (unthrottled "
                 f"{unthrottled / 1e6:.2f} M); each point a {interval:g} s mean", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="lower left", fontsize=9, framealpha=0.9)

    for r in rows:
        level = r["backpressure_level"]
        strip.axvspan(r["t_seconds"] - interval, r["t_seconds"],
                      color=LEVEL_COLORS.get(level, "#ccc"), lw=0)
    for x0, x1, _, _ in _phase_spans(rows, interval):
        if x0 > 0:
            strip.axvline(x0, color="grey", lw=0.8, ls=":")
    strip.set_yticks([0.5])
    strip.set_yticklabels(["producer\nbackpressure"], fontsize=8)
    strip.set_ylim(0, 1)
    handles = [plt.Rectangle((0, 0), 1, 1, color=col) for col in LEVEL_COLORS.values()]
    strip.legend(handles, [LEVEL_LABELS[k] for k in LEVEL_COLORS], ncol=3, fontsize=8,
                 loc="upper right", bbox_to_anchor=(1.0, -0.35), frameon=False,
                 handlelength=1)
    strip.set_xlim(0, rows[-1]["t_seconds"] if rows else 1)
    strip.set_xlabel("time [s]", loc="left")
    fig.subplots_adjust(left=0.09, right=0.97, top=0.93, bottom=0.1)
    fig.savefig(path)
    plt.close(fig)


def _plot_sojourn(ax, rows, interval):
    """The records' sojourn per interval (p99, p50 dashed), the phase
    boundaries dotted."""
    for key, style in (("sojourn_p99_ms", "-"), ("sojourn_p50_ms", "--")):
        pts = [(r["t_seconds"] - interval / 2, r[key]) for r in rows if r.get(key) is not None]
        ax.plot([t for t, _ in pts], [v for _, v in pts], color=CONSUMER_COLOR, ls=style,
                lw=1.4 if style == "-" else 1.0, label=key.split("_")[1])
    for x0, _, _, _ in _phase_spans(rows, interval):
        if x0 > 0:
            ax.axvline(x0, color="grey", lw=0.8, ls=":")
    ax.set_ylabel("record sojourn [ms]")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, framealpha=0.9)


def plot_slow_subpartition(results, doc, path):
    """Records/s of the fast and the slow consumer per mode (bars)."""
    modes = [r["mode"] for r in results]
    fast = [r["fast_consumer_records_per_s"] for r in results]
    slow = [r["slow_consumer_records_per_s"] for r in results]
    fig, ax = plt.subplots(figsize=(8.5, 4.6), dpi=110)
    x = range(len(modes))
    ax.bar([i - 0.2 for i in x], fast, width=0.4, color=CONSUMER_COLOR, label="fast consumer")
    ax.bar([i + 0.2 for i in x], slow, width=0.4, color="#d9534f",
           label="consumer 0 (blocked, except unimpeded)")
    ratios = doc["checks"]["fast_vs_unimpeded"]     # empty when unimpeded did not run
    top = max(fast + slow + [1])
    for i, (mode, v) in enumerate(zip(modes, fast)):
        if mode in ratios:
            ax.text(i - 0.2, v + top * 0.02, f"{ratios[mode]:.0%}", ha="center", fontsize=9)
    ax.set_xticks(list(x))
    ax.set_xticklabels(modes, fontsize=9 if len(modes) <= 4 else 8)
    ax.set_ylabel("records/s")
    cfg = doc["config"]
    ax.set_title(f"One blocked consumer of two, shared output pool of "
                 f"{cfg['pool_buffers']} x {cfg['segment_size']} B "
                 f"(fast consumer: % of unimpeded)", fontsize=10)
    ax.set_ylim(0, top * 1.35)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=9, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


DEBLOAT_COLORS = {"off": "#d9534f", "on": "#2f6fba"}


def _debloat_phases(axes, doc):
    """Each phase's boundary (dotted), a slowed one shaded, on every panel;
    the limits written over the top one."""
    for p in doc["phases"]:
        x0, x1 = p["from_seconds"], p["to_seconds"]
        slowed = p["consumer_limit_pct"] < p["producer_limit_pct"]
        for ax in axes:
            if slowed:
                ax.axvspan(x0, x1, color="#d9534f", alpha=0.08, lw=0)
            if x0 > 0:
                ax.axvline(x0, color="grey", lw=0.8, ls=":")
        axes[0].text((x0 + x1) / 2, 1.03, f"P {p['producer_limit_pct']:g} % / "
                     f"C {p['consumer_limit_pct']:g} %", transform=axes[0].get_xaxis_transform(),
                     ha="center", va="bottom", fontsize=7.5, color="#444")


def _by_run(rows, key, scale=1.0):
    """{run: (times at the intervals' middles, values)}, None values left out."""
    out = {}
    for mode in DEBLOAT_COLORS:
        pts = [(r["t_seconds"], r[key] * scale) for r in rows
               if r["debloat"] == mode and r[key] is not None]
        out[mode] = ([t for t, _ in pts], [v for _, v in pts])
    return out


def plot_debloat(doc, path):
    """Debloating off vs on over the same schedule, four panels over time:
    the consumer's throughput (the producer's dotted); the records'
    sojourn p99 (p50 dashed) with the target; the bytes in flight toward
    the consumer with the debloated buffer size; the segments handed back
    to the network pools, with the memory the exchange's buffers hold."""
    cfg, rows = doc["config"], doc["rows"]
    half = cfg["interval_seconds"] / 2
    fig, axes = plt.subplots(4, 1, figsize=(10, 10.5), dpi=110, sharex=True,
                             gridspec_kw={"hspace": 0.22})
    tput, soj, flight, mem = axes
    for mode, color in DEBLOAT_COLORS.items():
        label = f"debloating {mode}"
        for ax, key, scale, style in ((tput, "consumer_records_per_s", 1e-3, "-"),
                                      (tput, "producer_records_per_s", 1e-3, ":"),
                                      (soj, "sojourn_p99_ms", 1.0, "-"),
                                      (soj, "sojourn_p50_ms", 1.0, "--"),
                                      (flight, "in_flight_bytes", 1 / 1024, "-"),
                                      (mem, "given_back_segments", 1.0, "-")):
            t, v = _by_run(rows, key, scale)[mode]
            ax.plot([x - half for x in t], v, color=color, ls=style, lw=1.6 if style == "-"
                    else 1.0, label=label if style == "-" else None)
    tput.set_ylabel("records/s [thousands]\n(consumer; producer dotted)")
    soj.set_ylabel("sojourn [ms]\n(p99; p50 dashed)")
    soj.axhline(cfg["buffer_debloat"]["target"] * 1e3, color="#555", lw=0.8, ls="-.",
                label=f"target {cfg['buffer_debloat']['target']:g} s")
    soj.set_yscale("log")
    flight.set_ylabel("in flight [KiB]")
    size = flight.twinx()
    t, v = _by_run(rows, "buffer_size")["on"]
    size.step([x - half for x in t], v, where="mid", color="#2a9d8f", lw=1.0,
              label="debloated buffer size (on)")
    size.set_ylabel("buffer size [bytes]", color="#2a9d8f")
    size.set_ylim(0, cfg["segment_size"] * 1.1)
    flight.set_title("buffers in use as the gate counts them (queued, being filled, credit) x "
                     "buffer size (off: counted from the channels and the partition)",
                     loc="left", fontsize=7, color="#444")
    mem.set_title("segments handed back to the network pools (solid, left) and the memory "
                  "the exchange's buffers hold (dotted, right)", loc="left", fontsize=7,
                  color="#444")
    mem.set_ylabel("handed back\n[segments]")
    held = mem.twinx()
    for mode, color in DEBLOAT_COLORS.items():
        t, v = _by_run(rows, "held_bytes", 1 / 1024)[mode]
        held.plot([x - half for x in t], v, color=color, lw=0.8, ls=":")
    held.set_ylabel("held [KiB] (dotted)")
    held.set_ylim(bottom=0)
    mem.set_ylim(bottom=0, top=max([1] + [r["given_back_segments"] for r in rows]) * 1.2)
    _debloat_phases(axes, doc)
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    tput.legend(loc="lower left", fontsize=8, framealpha=0.9)
    soj.legend(loc="upper left", fontsize=8, framealpha=0.9)
    size.legend(loc="center right", fontsize=8, framealpha=0.9)
    mem.set_xlim(0, max(r["t_seconds"] for r in rows) if rows else 1)
    mem.set_xlabel("time in the schedule [s] (both runs; each point an interval)")
    d = cfg["buffer_debloat"]
    fig.suptitle(f"Buffer debloating off vs on: {cfg['exchange'].split(':')[0]}, "
                 f"{cfg['buffers']} buffers of {cfg['segment_size']} bytes; target "
                 f"{d['target']:g} s, period {d['period']:g} s, {d['samples']} samples",
                 fontsize=10)
    fig.subplots_adjust(left=0.1, right=0.9, top=0.925, bottom=0.055)
    fig.savefig(path)
    plt.close(fig)
