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
import socket
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
        self.name_ips = {}           # host -> what its name resolves to (None: /etc/hosts)

    def need(self, *hosts, name_ip=None):
        """Run workers on exactly ``hosts`` and wait until the application
        has an executor on each; ``name_ip``: the hosts that set no
        ``SPARK_LOCAL_IP`` and whose name resolves to the address given
        (their workers restart if they ran otherwise)."""
        name_ip = name_ip or {}
        restart = {h for h in self.cluster.workers
                   if h in hosts and self.name_ips.get(h) != name_ip.get(h)}
        for host in (set(self.cluster.workers) - set(hosts)) | restart:
            self.cluster.kill_host(host)
        if restart:                  # the executors of the old workers gone first
            self.driver.call("wait_executors", hosts=sorted(
                ADDRESSES[h] for h in self.cluster.workers), timeout=90)
        for host in set(hosts) - set(self.cluster.workers):
            self.cluster.start_worker(host, name_ip=name_ip.get(host))
            self.name_ips[host] = name_ip.get(host)
        self.driver.call("wait_executors", hosts=[ADDRESSES[h] for h in hosts], timeout=90,
                         )


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    logs = str(tmp_path_factory.mktemp("multihost"))
    cluster = netns_cluster.Cluster(logs)
    try:
        cluster.up()
        cluster.start_spark()
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


def test_tasks_bound_to_every_interface_on_the_same_ports_of_two_hosts(hosts):
    """host="0.0.0.0" with a pinned task port: each host's two tasks take
    the same two port numbers as the other host's.  Each advertises its
    own host's address (never 0.0.0.0), pairs on one host still take the
    same-host transport, and every peer is the task it registered as."""
    out = hosts.driver.call("keyed", n=100_000, partitions=4,
                            opts={"host": "0.0.0.0", "task_port": 7100})
    assert out["exact"] and out["placed"], out
    where = out["where"]
    for w in where:
        assert w["bound"].startswith("0.0.0.0:"), w
        # the environment's own address is its host's, as the task publishes
        assert w["address"] == w["published"], w
        w["bound"] = w["published"]
    _on_two_hosts(where)
    ports = sorted(int(w["published"].rpartition(":")[2]) for w in where)
    assert ports == [7100, 7100, 7101, 7101], where


# ---- firewalls ---------------------------------------------------------------------------------

def _firewall(ports, trusted=()):
    """An nftables ruleset that lets in only replies, loopback, ``trusted``
    sources and new connections to ``ports``."""
    sources = "".join(f"\n                ip saddr {a} accept" for a in trusted)
    return f"""
        table inet fbfw {{
            chain input {{
                type filter hook input priority 0; policy drop;
                ct state established,related accept
                iifname "lo" accept{sources}
                tcp dport {{ {", ".join(ports)} }} accept
            }}
        }}"""


def test_driver_firewall_with_pinned_ports(hosts):
    """Behind a driver firewall that lets in only Spark's pinned ports, an
    exchange whose rendezvous takes any free port fails within the
    connect timeout, saying where it could not connect and why; with
    rendezvous_port pinned and let through, it runs."""
    spark_ports = [str(MASTER_PORT), str(DRIVER_PORT), str(BLOCK_MANAGER_PORT)]
    hosts.cluster.nft("h0", _firewall(spark_ports + ["7090-7106"]))
    try:
        t0 = time.monotonic()
        with pytest.raises(netns_cluster.DriverError) as err:
            hosts.driver.call("keyed", n=1000, partitions=4, opts={"connect_timeout": 2.0})
        took = time.monotonic() - t0
        message = err.value.message
        assert "could not connect to the exchange's rendezvous on the driver at " \
               f"{ADDRESSES['h0']}:" in message, message
        assert "within 2 s (connect_timeout)" in message, message
        assert "rendezvous_port" in message, message
        assert took < 20, took
        out = hosts.driver.call("keyed", n=50_000, partitions=4,
                                opts={"rendezvous_port": 7090, "connect_timeout": 2.0})
        assert out["exact"] and out["placed"], out
    finally:
        hosts.cluster.flush_nft("h0", "fbfw")


def test_worker_firewalls_with_pinned_task_ports(hosts):
    """Workers that let in only Spark's ports from each other: tasks on
    different hosts cannot connect to each other's servers on any free
    port, and the error names both tasks and which way it failed; with
    task_port pinned and its range let through, the exchange runs."""
    ports = [str(WORKER_PORT), f"{BLOCK_MANAGER_PORT}-{BLOCK_MANAGER_PORT + 16}", "7100-7116"]
    for host in ("h1", "h2"):
        hosts.cluster.nft(host, _firewall(ports, trusted=[ADDRESSES["h0"]]))
    try:
        with pytest.raises(netns_cluster.DriverError) as err:
            hosts.driver.call("keyed", n=1000, partitions=4, opts={"connect_timeout": 2.0})
        message = err.value.message
        found = re.search(r"task \d at (10\.231\.0\.[23]:\d+) could not connect to task \d at "
                          r"(10\.231\.0\.[23]:\d+) to read its output \(within "
                          r"connect_timeout=2 s\).*?cannot connect to (\S+): timed out", message)
        assert found, message
        # the peer named is the one dialed, on the other host
        me, peer, dialed = found.groups()
        assert peer == dialed and me.rpartition(":")[0] != peer.rpartition(":")[0], message
        assert "task_port" in message, message
        out = hosts.driver.call("keyed", n=50_000, partitions=4,
                                opts={"task_port": 7100, "connect_timeout": 2.0})
        assert out["exact"] and out["placed"], out
        _on_two_hosts(out["where"])
    finally:
        for host in ("h1", "h2"):
            hosts.cluster.flush_nft(host, "fbfw")


@pytest.mark.parametrize("blocked", [("h1", "h2"), ("h2", "h1")], ids=lambda b: "-".join(b))
def test_a_firewall_that_drops_one_direction_lets_the_exchange_run_the_other_way(
        hosts, blocked):
    """``dst`` drops new connections from ``src`` to the task ports and
    lets those the other way through: whichever task dials first, each
    pair of tasks on the two hosts shares the connection made the open
    way (the blocked dial gives way to it), and the exchange runs, twice."""
    src, dst = blocked
    hosts.need("h1", "h2")
    hosts.cluster.nft(dst, f"""
        table inet fbfw {{
            chain input {{
                type filter hook input priority 0; policy accept;
                ip saddr {ADDRESSES[src]} tcp dport 7100-7116 ct state new drop
            }}
        }}""")
    try:
        for _ in range(2):
            out = hosts.driver.call("keyed", n=50_000, partitions=4,
                                    opts={"task_port": 7100, "connect_timeout": 5.0})
            assert out["exact"] and out["placed"], out
            _on_two_hosts(out["where"])           # one connection per pair of tasks
    finally:
        hosts.cluster.flush_nft(dst, "fbfw")


def test_tasks_that_advertise_one_address_fail_naming_both(hosts):
    """advertise= one address for every task, with the same ports on both
    hosts: two tasks say they are at the same address, and the job fails
    saying which (no task dials a peer that is another, or itself)."""
    hosts.need("h1", "h2")
    with pytest.raises(netns_cluster.DriverError) as err:
        hosts.driver.call("keyed", n=1000, partitions=4,
                          opts={"task_port": 7100, "advertise": ADDRESSES["h1"],
                                "connect_timeout": 2.0})
    message = err.value.message
    found = re.search(r"task (\d) and task (\d) of the exchange advertise the same address, "
                      r"10\.231\.0\.2:(710[01])", message)
    assert found and found.group(1) != found.group(2), message
    assert "SPARK_LOCAL_IP" in message, message


# ---- failures ----------------------------------------------------------------------------------

def _markers(directory, count, timeout=60.0):
    """The markers of the first ``count`` task attempts that connected."""
    deadline = time.monotonic() + timeout
    while True:
        found = sorted(glob.glob(os.path.join(directory, "[0-9]*")))
        if len(found) >= count:
            out = []
            for path in found:
                with open(path) as f:
                    out.append(json.load(f))
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(found)} of {count} tasks connected within {timeout} s")
        time.sleep(0.05)


def _go_fast(directory):
    open(os.path.join(directory, "fast"), "w").close()


def _strike_mid_exchange(hosts, tmp_path, strike, shuffle, timeout=30.0, result_timeout=120):
    """Start a slow keyed exchange of four tasks, call ``strike(markers)``
    once all four are connected, let later attempts run at full speed;
    returns (the result or the DriverError, seconds from the strike)."""
    markers = str(tmp_path)
    call = hosts.driver.submit("keyed", n=40_000, partitions=4, shuffle=shuffle,
                               slow_seconds=30.0, marker_dir=markers,
                               opts={"timeout": timeout})
    where = _markers(markers, 4)
    strike(where)
    t0 = time.monotonic()
    _go_fast(markers)
    try:
        result = hosts.driver.result(call, result_timeout)
    except netns_cluster.DriverError as exc:
        result = exc
    return result, time.monotonic() - t0


def _kill_python_worker(where):
    os.kill(where[1]["pid"], signal.SIGKILL)


def test_a_killed_python_worker_fails_the_job_when_the_exchange_is_the_last_stage(
        hosts, tmp_path):
    result, took = _strike_mid_exchange(hosts, tmp_path, _kill_python_worker, shuffle=False)
    assert isinstance(result, netns_cluster.DriverError), result
    assert "Could not recover from a failed barrier ResultStage" in result.message
    assert "Python worker exited unexpectedly" in result.message, result.message
    assert took < 20, took


def test_a_killed_python_worker_retries_the_exchange_feeding_a_shuffle(hosts, tmp_path):
    hosts.driver.call("close_rendezvous")
    result, took = _strike_mid_exchange(hosts, tmp_path, _kill_python_worker, shuffle=True)
    assert not isinstance(result, Exception), result
    assert result["exact"], result
    first = {m["task_attempt"] for m in _markers(str(tmp_path), 4)[:4]}
    assert not first & {w["task_attempt"] for w in result["where"]}     # a new attempt ran
    _on_two_hosts(result["where"])
    assert hosts.driver.call("rendezvous_attempts")[-1] == 2


def test_a_lost_host_comes_back_in_time_for_the_retried_exchange(hosts, tmp_path):
    """kill -9 of every process of a worker host while the exchange feeds a
    shuffle: the retried attempt waits for its four slots, the host comes
    back within the exchange's timeout, and the attempt runs."""
    hosts.need("h1", "h2")

    def lose_h2(where):
        hosts.cluster.kill_host("h2")
        hosts.cluster.start_worker("h2")

    result, took = _strike_mid_exchange(hosts, tmp_path, lose_h2, shuffle=True, timeout=60.0)
    assert not isinstance(result, Exception), result
    assert result["exact"], result
    _on_two_hosts(result["where"])


def test_a_lost_host_fails_the_job_when_the_exchange_is_the_last_stage(hosts, tmp_path):
    hosts.need("h1", "h2")
    result, took = _strike_mid_exchange(hosts, tmp_path,
                                        lambda where: hosts.cluster.kill_host("h2"),
                                        shuffle=False)
    assert isinstance(result, netns_cluster.DriverError), result
    assert "Could not recover from a failed barrier ResultStage" in result.message
    assert took < 20, took


# ---- NAT and a cut link --------------------------------------------------------------------------

def test_executors_behind_nat(hosts):
    """h3 reaches the others through a router that masquerades it: the
    driver sees its executor at the router's address, which is not h3's.
    Its tasks bind and advertise h3's own address (reachable: routed); and
    with the router forwarding the task ports, they advertise the router's
    address instead (advertise=) and their peers reach them through it."""
    hosts.need("h1", "h3")
    out = hosts.driver.call("keyed", n=50_000, partitions=4)
    assert out["exact"] and out["placed"], out
    _on_two_hosts(out["where"], "h1", "h3")
    behind = [w for w in out["where"] if w["local_ip"] == ADDRESSES["h3"]]
    assert all(info.startswith(ADDRESSES["nat"] + ":")
               for w in behind for info in [w["infos"][w["index"]]]), behind

    hosts.cluster.nft("nat", f"""
        table ip portfwd {{
            chain pre {{
                type nat hook prerouting priority -100;
                iifname "eth0" ip daddr {ADDRESSES['nat']} tcp dport 7100-7116 dnat to {ADDRESSES['h3']}
            }}
        }}""")
    try:
        out = hosts.driver.call("keyed", n=50_000, partitions=4, opts={
            "task_port": 7100, "advertise": {ADDRESSES["h3"]: ADDRESSES["nat"]}})
    finally:
        hosts.cluster.exec("nat", "nft", "delete", "table", "ip", "portfwd", check=False)
    assert out["exact"] and out["placed"], out
    where = out["where"]
    for w in where:
        if w["local_ip"] == ADDRESSES["h3"]:
            assert w["bound"].rpartition(":")[0] == ADDRESSES["h3"], w
            assert w["published"].rpartition(":")[0] == ADDRESSES["nat"], w
        else:
            assert w["published"].rpartition(":")[0] == ADDRESSES["h1"], w
    _check_transports(where)
    # h1's tasks reached h3's through the router's address
    for w in where:
        if w["local_ip"] == ADDRESSES["h1"]:
            peers = {p for p, _ in w["connections"]}
            assert sum(p.startswith(ADDRESSES["nat"] + ":") for p in peers) == 2, w


@pytest.mark.parametrize("name_ip", ["127.0.0.1", "127.0.1.1"])
def test_a_host_whose_name_is_loopback_advertises_its_address_toward_its_peers(hosts, name_ip):
    """h3 (behind the router: the driver saw its executor at the router's
    address) sets no SPARK_LOCAL_IP and its name resolves to ``name_ip``:
    its tasks advertise the address h3 reaches its peers from, with
    allGather (no driver address to route toward) as with the driver's
    rendezvous, and the DataFrame exchange too; never loopback."""
    hosts.need("h1", "h3", name_ip={"h3": name_ip})
    resolved = hosts.cluster.exec("h3", "getent", "hosts", socket.gethostname())
    assert resolved.stdout.split()[0] == name_ip, resolved.stdout
    runs = [("keyed", {"n": 50_000, "partitions": 4, "opts": {"rendezvous": r}})
            for r in ("barrier", "driver")]
    runs.append(("arrow", {"n": 50_000, "partitions": 4, "opts": {"rendezvous": "barrier"}}))
    for fn, kwargs in runs:
        out = hosts.driver.call(fn, **kwargs)
        assert out["exact"] and out["placed"], (fn, kwargs, out)
        where = out["where"]
        behind = [w for w in where if w["local_ip"] is None]
        assert len(behind) == 2, where
        for w in behind:
            assert w["published"].rpartition(":")[0] == ADDRESSES["h3"], (fn, kwargs, w)
            assert w["bound"].rpartition(":")[0] == ADDRESSES["h3"], (fn, kwargs, w)
        _check_transports(where)


def test_a_cut_link_fails_the_retried_exchange_within_its_timeout(hosts, tmp_path):
    """h3's link is cut while the exchange feeds a shuffle: Spark loses
    its executor, retries the stage, which cannot get its four slots; the
    driver cancels it after the exchange's timeout, saying why, instead of
    waiting forever."""
    hosts.need("h1", "h3")
    try:
        result, took = _strike_mid_exchange(
            hosts, tmp_path, lambda where: hosts.cluster.cut("h3"), shuffle=True, timeout=6.0,
            result_timeout=90)
    finally:
        hosts.cluster.mend("h3")
        hosts.cluster.kill_host("h3")
    assert isinstance(result, netns_cluster.DriverError), result
    message = result.message
    assert re.search(r"cancelled because flinkbuf: attempt \d of stage \d+", message), message
    assert re.search(r"needs 4 task slots at once and the cluster has 2 \(a host or an "
                     r"executor was lost\): the stage has waited for them longer than its "
                     r"timeout \(6 s\)", message), message
    # the master notices within 8 s, the attempt waits 6 s, a second for the watch
    assert took < 30, took


# What README's "On a cluster" states a cut link takes to fail an exchange
# of timeout=60 that feeds a shuffle, at most: the stalled connection's end
# (TCP keepalive and TCP_USER_TIMEOUT, 25 s), the retried attempt's wait of
# `timeout`, and Spark's loss of the executor, whichever comes last.
CUT_LINK_BOUND = 150


def test_a_cut_link_fails_an_exchange_of_the_default_timeout_within_its_bound(
        hosts, tmp_path):
    """As above with timeout=60: the job fails within the bound README
    states (not a speed figure: the point is that it does not hang)."""
    hosts.need("h1", "h3")
    try:
        result, took = _strike_mid_exchange(
            hosts, tmp_path, lambda where: hosts.cluster.cut("h3"), shuffle=True, timeout=60.0,
            result_timeout=CUT_LINK_BOUND + 60)
    finally:
        hosts.cluster.mend("h3")
        hosts.cluster.kill_host("h3")
    print(f"a cut link failed the exchange of timeout=60 after {took:.1f} s")
    assert isinstance(result, netns_cluster.DriverError), result
    assert "cancelled because flinkbuf: attempt" in result.message, result.message
    assert took < CUT_LINK_BOUND, took
