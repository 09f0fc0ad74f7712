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


# Network tests that do not choose a transport themselves run once per
# transport between processes on this host, through FLINKBUF_NET_TRANSPORT
# (what transport="auto" means; child processes inherit it), and once more
# over TCP with every connection sealed (FLINKBUF_NET_ENCRYPTION=1), as
# connections between hosts are by default.  Tests that speak the wire
# format in plaintext themselves (a raw peer) are marked ``plaintext_wire``
# and run unsealed only.
NET_TRANSPORTS = ["unix", "tcp", "shm", "tcp-sealed"]
SOCKETLESS_MODULES = {"test_network_wire", "test_network_credit", "test_network_buffer_pool"}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "plaintext_wire: the test speaks the wire format in plaintext itself, so "
        "its environments are not sealed")


def pytest_generate_tests(metafunc):
    module = metafunc.module.__name__.rpartition(".")[2]
    if (module.startswith("test_network_") and module not in SOCKETLESS_MODULES
            and "transport" not in metafunc.fixturenames
            and metafunc.definition.get_closest_marker("one_transport") is None):
        metafunc.fixturenames.append("net_transport")
        plain = metafunc.definition.get_closest_marker("plaintext_wire") is not None
        metafunc.parametrize("net_transport",
                             [t for t in NET_TRANSPORTS if not (plain and t.endswith("-sealed"))])


@pytest.fixture
def net_transport(request):
    return request.param


@pytest.fixture(autouse=True)
def _net_transport_variable(request, monkeypatch):
    """Set before the test's other fixtures make their environments."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "net_transport" in callspec.params:
        transport, _, sealed = callspec.params["net_transport"].partition("-")
        monkeypatch.setenv("FLINKBUF_NET_TRANSPORT", transport)
        if sealed:
            monkeypatch.setenv("FLINKBUF_NET_ENCRYPTION", "1")
    elif request.node.get_closest_marker("plaintext_wire") is not None:
        monkeypatch.setenv("FLINKBUF_NET_ENCRYPTION", "0")


def pytest_sessionstart(session):
    if os.environ.get("FLINKBUF_REQUIRE_DEBUG") == "1" and core.debug_counters() is None:
        raise pytest.UsageError(
            "FLINKBUF_REQUIRE_DEBUG=1 but flinkbuf was built without FLINKBUF_DEBUG; "
            "run `make test` (it builds the debug extension)")


@pytest.fixture
def children():
    """Child processes of network_helpers started by one test, all stopped
    (and checked for crashes) at its end."""
    from network_helpers import Children
    c = Children()
    yield c
    c.stop_all()


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
