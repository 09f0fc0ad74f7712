"""Shared test setup: hypothesis profiles and the leak check after every test."""

import gc
import os

import pytest
from hypothesis import HealthCheck, settings

import flinkbuf.buffer as core

settings.register_profile(
    "ci", max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", max_examples=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_sessionstart(session):
    if os.environ.get("FLINKBUF_REQUIRE_DEBUG") == "1" and core.debug_counters() is None:
        raise pytest.UsageError(
            "FLINKBUF_REQUIRE_DEBUG=1 but flinkbuf was built without FLINKBUF_DEBUG; "
            "run `make test` (it builds the debug extension)")


@pytest.fixture(autouse=True)
def no_leaks():
    """Every test must give back every buffer and segment it took."""
    yield
    if core.debug_counters() is None:
        return
    gc.collect()
    counters = core.debug_counters()
    assert counters == {"standalone_segments": 0, "live_buffers": 0, "segments_out": 0}, (
        f"leaked flinkbuf objects after the test: {counters}")
