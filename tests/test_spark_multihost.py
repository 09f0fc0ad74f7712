"""flinkbuf.spark on a Spark standalone cluster of three simulated hosts
(network namespaces joined by a bridge, netns_cluster.py): a master and the
driver on h0, a worker of two cores on h1 and on h2, one Spark application
for the whole module.  Tests that take a host away put it back for the next
one that needs it (``hosts``)."""

import glob
import json
import re
import os
import signal
import time

import pytest

import netns_cluster
from netns_cluster import ADDRESSES, BLOCK_MANAGER_PORT, DRIVER_PORT, MASTER_PORT, WORKER_PORT

pytestmark = pytest.mark.slow

_WHY_NOT = netns_cluster.unavailable()
if _WHY_NOT is not None:
    pytestmark = [pytestmark, pytest.mark.skip(reason=f"no multi-host cluster: {_WHY_NOT}")]


class _Hosts:
    """The cluster and its driver, with the workers each test needs."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.driver = cluster.driver

    def need(self, *hosts):
        """Run workers on exactly ``hosts`` and wait until the application
        has an executor on each."""
        for host in set(self.cluster.workers) - set(hosts):
            self.cluster.kill_host(host)
        for host in set(hosts) - set(self.cluster.workers):
            self.cluster.start_worker(host)
        self.driver.call("wait_executors", hosts=[ADDRESSES[h] for h in hosts], timeout=90,
                         )


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    logs = str(tmp_path_factory.mktemp("multihost"))
    cluster = netns_cluster.Cluster(logs)
    try:
        cluster.up()
        cluster.start_master()
        cluster.wait_for_log(cluster.master_log, r"I have been elected leader", timeout=60)
        for host in ("h1", "h2"):
            cluster.start_worker(host)
        driver = cluster.start_driver()
        driver.result(0, timeout=120)          # the session is up
        h = _Hosts(cluster)
        h.need("h1", "h2")
        yield h
    finally:
        cluster.close()


def _check_transports(where):
    """Every task's connections: TCP to tasks on other hosts, a same-host
    transport (shared memory or a Unix socket) within its host."""
    hosts = {w["published"]: w["published"].rpartition(":")[0] for w in where}
    for w in where:
        own = w["published"].rpartition(":")[0]
        for peer, transport in w["connections"]:
            assert peer in hosts, (peer, where)
            if hosts[peer] == own:
                assert transport in ("shm", "unix"), (w, peer)
            else:
                assert transport == "tcp", (w, peer)


def _on_two_hosts(where, a="h1", b="h2"):
    """Four tasks in four slots of two hosts: two on each."""
    assert [w["index"] for w in where] == [0, 1, 2, 3]
    placed = sorted(w["local_ip"] for w in where)
    assert placed == sorted([ADDRESSES[a]] * 2 + [ADDRESSES[b]] * 2), where
    for w in where:
        # bound to, and published as, an address of the task's own host
        assert w["published"].rpartition(":")[0] == w["local_ip"], w
        assert w["bound"].rpartition(":")[0] == w["local_ip"], w
        assert len(w["connections"]) == 3, w       # one per peer
    _check_transports(where)


def test_keyed_exchange_four_tasks_on_two_hosts(hosts):
    out = hosts.driver.call("keyed", n=100_000, partitions=4)
    assert out["exact"] and out["placed"], out
    _on_two_hosts(out["where"])


def test_arrow_exchange_four_tasks_on_two_hosts(hosts):
    out = hosts.driver.call("arrow", n=200_000, partitions=4)
    assert out["exact"] and out["placed"], out
    _on_two_hosts(out["where"])

