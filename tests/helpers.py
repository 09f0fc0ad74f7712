"""Small helpers shared by the tests."""

import csv
import sys
import threading
import time


def run_in_thread(fn, *args, **kwargs):
    """Start fn in a daemon thread; returns (thread, result) where result is a
    dict that gets 'value' or 'error' and 'elapsed'."""
    result = {}

    def target():
        t0 = time.monotonic()
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result["error"] = e
        result["elapsed"] = time.monotonic() - t0

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, result


def wait_until(predicate, timeout=5.0, interval=0.001):
    """Poll predicate until true; False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def ticks_during(call):
    """How often another Python thread ran while ``call()`` ran (with a
    short switch interval): a call that holds the GIL throughout lets it run
    once or twice at most."""
    ticks = []
    done = threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(1)
            done.wait(0.0005)

    t = threading.Thread(target=tick)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        t.start()
        ticks.clear()
        call()
        return len(ticks)
    finally:
        done.set()
        t.join()
        sys.setswitchinterval(old)


def read_csv(path):
    """(the header's columns, the rows as dicts) of the CSV table at ``path``."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)
