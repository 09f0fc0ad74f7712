import os

SMOKE = os.environ.get("FLINKBUF_BENCH_SMOKE") == "1"


def scale(full, smoke):
    """Work per measured call: smaller in smoke runs (CI)."""
    return smoke if SMOKE else full
