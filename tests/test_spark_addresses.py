"""What the exchanges' tasks bind, advertise and dial, the ports they take,
the errors that name what failed, and the driver's watch over stage
attempts that cannot get their slots: the parts that need no Spark job
(the multi-host tests run them on a cluster)."""

import collections
import dataclasses
import errno
import socket
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flinkbuf.errors import AuthenticationError, NoFreePortError, RemoteConnectionError
from flinkbuf.network.addresses import is_loopback
from flinkbuf.spark import _rendezvous, _slot_watch, _task_environment, _task_peers
from flinkbuf.spark._session import ClassicSession
from flinkbuf.spark._spec import Timeouts as _Timeouts
from flinkbuf.spark._spec import check_options, make_spec

SECRET = b"flinkbuf-spark-address-test-secret"
# Addresses of no host here (TEST-NET-1, RFC 5737).
ELSEWHERE = "192.0.2.7"
ELSEWHERE_TOO = "192.0.2.8"


class _Ctx:
    """What the address logic asks of a BarrierTaskContext: task 0's
    executor at ``seen``, task 1's at ``peer`` (by default the same)."""

    def __init__(self, seen, peer=None):
        self.seen = seen
        self.peer = peer or seen

    def getTaskInfos(self):
        info = collections.namedtuple("Info", "address")
        return [info(self.seen), info(self.peer)]


def _spec(**kw):
    base = dict(num_partitions=None, key=None, selector="hash", codec="typed",
                segment_size=4096, buffers_per_channel=2, floating_buffers=0,
                buffer_timeout=0.01, max_record_size=1 << 20, max_parallelism=None,
                host=None, timeout=10.0, monitor=None)
    base.update(kw)
    return make_spec(check_options(2, None, **base))


# ---- addresses -------------------------------------------------------------------------------

def test_own_host_prefers_spark_local_ip(monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    assert _task_environment.own_host(_Ctx(f"{ELSEWHERE}:4000"), 0) == "127.0.0.1"


def test_own_host_takes_the_executors_address_when_it_is_this_hosts(monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    assert _task_environment.own_host(_Ctx("127.0.0.2:4000"), 0) == "127.0.0.2"


def test_own_host_behind_a_nat_takes_the_address_on_the_route_to_the_driver(monkeypatch):
    """The driver saw the executor at an address that is not this host's
    (a NAT's) and SPARK_LOCAL_IP names none of this host's either: the
    address this host reaches the driver from."""
    monkeypatch.setenv("SPARK_LOCAL_IP", ELSEWHERE)
    monkeypatch.setattr(socket, "gethostname", lambda: "no-such-host.invalid")
    assert _task_environment.own_host(_Ctx(f"{ELSEWHERE}:4000"), 0, ("127.0.0.1", 9)) == "127.0.0.1"


def test_own_host_that_finds_no_address_says_what_to_set(monkeypatch):
    """Every address found is loopback and a peer is on another host."""
    monkeypatch.setenv("SPARK_LOCAL_IP", ELSEWHERE)
    monkeypatch.setattr(socket, "gethostname", lambda: "no-such-host.invalid")
    monkeypatch.setattr(_task_environment, "source_address", lambda target: None)
    monkeypatch.setattr(_task_environment, "host_address", lambda: "127.0.0.1")
    with pytest.raises(RemoteConnectionError, match=rf"task 1 found no address of its own host "
                                                    rf".*SPARK_LOCAL_IP is {ELSEWHERE}.*Spark "
                                                    rf"saw the executor at {ELSEWHERE_TOO}.*"
                                                    rf"every address found is loopback"):
        _task_environment.own_host(_Ctx(f"{ELSEWHERE}:4000", f"{ELSEWHERE_TOO}:4000"), 1)


@pytest.mark.parametrize("name_ip", ["127.0.0.1", "127.0.1.1"])
def test_own_host_never_advertises_loopback_to_a_peer_on_another_host(monkeypatch, name_ip):
    """No SPARK_LOCAL_IP, the executor seen at an address not this host's
    (a NAT's), no driver address (allGather), the host's name resolving to
    loopback: the address this host reaches the peer's executor from."""
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.setattr(socket, "gethostbyname", lambda name: name_ip)
    routes = {ELSEWHERE_TOO: "10.9.8.7"}
    asked = []

    def source_address(target):
        asked.append(target)
        return routes.get(target[0])

    monkeypatch.setattr(_task_environment, "source_address", source_address)
    monkeypatch.setattr(_task_environment, "host_address", lambda: "127.0.0.1")
    ctx = _Ctx(f"{ELSEWHERE}:4000", f"{ELSEWHERE_TOO}:4000")
    assert _task_environment.own_host(ctx, 0) == "10.9.8.7"
    assert (ELSEWHERE_TOO, 9) in asked
    # toward the driver first, when it is known
    routes[ELSEWHERE] = "10.9.8.6"
    assert _task_environment.own_host(ctx, 0, (ELSEWHERE, 7078)) == "10.9.8.6"
    # with every peer on this host (its executor at the same address), the name's
    routes.clear()
    assert _task_environment.own_host(_Ctx(f"{ELSEWHERE}:4000"), 0) == name_ip


def test_choose_host_skips_loopback_unless_every_peer_is_here():
    choose = _task_environment.choose_host
    here = {"10.0.0.1"}.__contains__
    # a peer on another host: loopback is passed over, the rest keep their order
    assert choose([None, "127.0.1.1", "10.0.0.1"], ["10.0.0.2"], is_own=here) == "10.0.0.1"
    assert choose(["127.0.0.1", "127.0.1.1", "::1"], ["10.0.0.2"], is_own=here) is None
    # every peer here: loopback, on this host itself, at its executor's address, or one of
    # this host's: the first candidate
    for peers in ([], ["127.0.0.1"], ["10.0.0.1"], ["exec-1"]):
        assert choose(["127.0.1.1", "10.0.0.1"], peers, here=("exec-1",),
                      is_own=here) == "127.0.1.1", peers
    assert choose([None, None], [], is_own=here) is None


@given(candidates=st.lists(st.sampled_from([None, "127.0.0.1", "127.0.1.1", "::1",
                                            "10.0.0.1", "10.0.0.3", "fd00::1"]), max_size=5),
       peers=st.lists(st.sampled_from(["127.0.0.1", "10.0.0.1", "10.0.0.2", "exec-1",
                                       "exec-2"]), max_size=4))
def test_choose_host_is_the_first_candidate_a_peer_can_reach(candidates, peers):
    """The docstring's contract: the first candidate that is not loopback
    when some peer is on another host, else the first one found; never
    loopback while a peer is elsewhere."""
    own = {"10.0.0.1"}
    chosen = _task_environment.choose_host(candidates, peers, here=("exec-1",),
                                           is_own=own.__contains__)
    elsewhere = [p for p in peers if p not in own and p != "exec-1" and not
                 p.startswith("127.")]
    fits = [c for c in candidates if c and not (elsewhere and is_loopback(c))]
    assert chosen == (fits[0] if fits else None)
    if elsewhere and chosen is not None:
        assert not is_loopback(chosen)


def test_addresses_never_advertise_a_wildcard(monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    ctx = _Ctx(f"{ELSEWHERE}:4000")
    task_addresses = _task_environment.task_addresses
    assert task_addresses(ctx, 0, _spec()) == ("127.0.0.1", "127.0.0.1")
    assert task_addresses(ctx, 0, _spec(host="0.0.0.0")) == ("0.0.0.0", "127.0.0.1")
    assert task_addresses(ctx, 0, _spec(host="0.0.0.0", advertise="10.1.2.3")) == \
        ("0.0.0.0", "10.1.2.3")
    # a dict maps a host's own address to the one it advertises; others keep theirs
    assert task_addresses(ctx, 0, _spec(advertise={"127.0.0.1": "10.9.9.9"})) == \
        ("127.0.0.1", "10.9.9.9")
    assert task_addresses(ctx, 0, _spec(advertise={"127.0.0.5": "10.9.9.9"})) == \
        ("127.0.0.1", "127.0.0.1")


@pytest.mark.parametrize("kw, error, match", [
    ({"advertise": "0.0.0.0"}, ValueError, "advertise must be an address peers can dial"),
    ({"advertise": "[::]"}, ValueError, "advertise must be an address peers can dial"),
    ({"advertise": 7}, TypeError, "advertise must be a host, a dict of host -> host or None"),
    ({"advertise": {"10.0.0.1": "0.0.0.0"}}, ValueError, r"advertise\['10.0.0.1'\] must be"),
    ({"advertise": {1: "10.0.0.1"}}, TypeError, "a key of advertise must be a str"),
    ({"task_port": -1}, ValueError, "task_port"),
    ({"task_port": 65536}, ValueError, "task_port"),
    ({"rendezvous_port": 1.5}, TypeError, "rendezvous_port"),
    ({"port_retries": -1}, ValueError, "port_retries"),
    ({"connect_timeout": 0}, ValueError, "connect_timeout"),
])
def test_bad_address_and_port_options_are_refused(kw, error, match):
    with pytest.raises(error, match=match):
        _spec(**kw)


# ---- the spec and the bounds of the waits -------------------------------------------------------

def test_the_spec_is_frozen_and_travels_in_a_closure():
    """The spec is made once on the driver and reaches each task through
    cloudpickle (as Spark ships a stage's closure): nothing can change it
    on the way, and what arrives is what was made."""
    import pickle

    from pyspark import cloudpickle

    spec = _spec(advertise={"127.0.0.1": "10.9.9.9"}, task_port=7100, key=0,
                 selector="hash", encryption=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.encryption = False
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.options.timeouts.io = 1.0
    arrived = pickle.loads(cloudpickle.dumps(lambda: spec))()
    assert arrived == spec                      # every field, the secret included
    assert arrived.secret == spec.secret and len(spec.secret) == 32
    assert repr(spec.secret) not in repr(spec)  # the secret is not shown
    assert arrived.options.advertise == {"127.0.0.1": "10.9.9.9"}


def test_the_bounds_of_the_waits_come_from_timeout_and_connect_timeout():
    assert _spec(timeout=42.0, connect_timeout=3.0).timeouts == _Timeouts(
        connect=3.0, request=42.0, io=42.0, slots=42.0, rendezvous=42.0)


def test_each_wait_of_a_task_takes_its_own_bound(monkeypatch):
    """The task's environment waits for a connection, a partition request
    and a stalled frame by the bounds of those names, its registration at
    the rendezvous for the acknowledgement by the connect bound and for the
    answer by the rendezvous one."""
    from flinkbuf.spark import _task_peers

    bounds = _Timeouts(connect=1.0, request=2.0, io=3.0, slots=4.0, rendezvous=5.0)
    spec = dataclasses.replace(_spec(), options=dataclasses.replace(_spec().options,
                                                                     timeouts=bounds),
                               rendezvous=("127.0.0.1", 9))
    seen = {}

    def environment(*args, **kw):
        seen["environment"] = kw
        raise OSError(errno.EPERM, "not started")

    def registration(*args, **kw):
        seen["registration"] = kw

    monkeypatch.setattr(_task_environment, "NetworkEnvironment", environment)
    monkeypatch.setattr(_rendezvous, "Registration", registration)
    with pytest.raises(OSError, match="not started"):
        _task_environment.start_environment(spec, 2, "127.0.0.1", "127.0.0.1", "", 5)
    _task_peers.register(spec, _FakeTaskContext(), 7, "127.0.0.1:1")
    env = seen["environment"]
    assert (env["connect_timeout"], env["request_timeout"], env["io_timeout"]) == (1.0, 2.0, 3.0)
    reg = seen["registration"]
    assert (reg["connect_timeout"], reg["timeout"]) == (1.0, 5.0)


def test_the_driver_s_rendezvous_and_slot_watch_take_their_own_bounds(monkeypatch):
    from flinkbuf.spark import _prepare

    bounds = _Timeouts(connect=1.0, request=2.0, io=3.0, slots=4.0, rendezvous=5.0)
    options = dataclasses.replace(_spec().options, timeouts=bounds, rendezvous_port=7)
    seen = {}

    class Server:
        address = ("127.0.0.1", 7)

        def __init__(self, *args, **kw):
            seen["server"] = kw

    monkeypatch.setattr(_rendezvous, "RendezvousServer", Server)
    monkeypatch.setattr(_slot_watch.SlotWatch, "watch",
                        classmethod(lambda cls, sc, server, n, timeout:
                                    seen.setdefault("watch", timeout)))
    session = ClassicSession(_FakeSession())
    server = _prepare.start_rendezvous(session, SECRET, 2, options, 3)
    assert isinstance(server, Server)
    assert (seen["server"]["timeout"], seen["server"]["port"],
            seen["server"]["port_retries"]) == (5.0, 7, 3)
    assert "watch" not in seen                 # the exchange's preparation starts it
    session.watch(server, 2, options.timeouts.slots, "an exchange")
    assert seen["watch"] == 4.0


class _FakeTaskContext(_Ctx):
    def __init__(self):
        super().__init__("127.0.0.1:1")

    def stageId(self):
        return 1

    def partitionId(self):
        return 0


class _FakeSession:
    """What the driver's helpers ask of a SparkContext with no JVM."""

    def getConf(self):
        return {"spark.driver.host": "127.0.0.1"}


# ---- ports -----------------------------------------------------------------------------------

def _listen(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        s.listen(1)
    except BaseException:
        s.close()
        raise
    return s


def _free_run(length):
    """A first port of ``length`` free consecutive ports."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + length > 65535:
            continue
        try:
            held = [_listen(p) for p in range(first, first + length)]
        except OSError:
            continue
        for s in held:
            s.close()
        return first
    pytest.skip("no run of free ports")


def test_a_taken_port_moves_to_the_next_as_spark_does():
    first = _free_run(3)
    taken = [_listen(first), _listen(first + 1)]
    try:
        got = _rendezvous.bind_in_range(_listen, "127.0.0.1", first, 2, "the server", "task_port")
        assert got.getsockname()[1] == first + 2
        got.close()
        with pytest.raises(NoFreePortError) as err:
            _rendezvous.bind_in_range(_listen, "127.0.0.1", first, 1, "the exchange's task server",
                                      "task_port")
        assert err.value.errno == errno.EADDRINUSE
        assert f"the exchange's task server found no free port on 127.0.0.1 in " \
               f"{first}-{first + 1} (task_port={first} and 1 more" in str(err.value)
    finally:
        for s in taken:
            s.close()


def test_the_rendezvous_binds_its_pinned_port():
    first = _free_run(2)
    with _listen(first):
        with _rendezvous.RendezvousServer(SECRET, 2, timeout=5, port=first,
                                          port_retries=1) as server:
            assert server.address == ("127.0.0.1", first + 1)


def test_a_task_server_takes_a_port_of_its_range():
    first = _free_run(2)
    spec = dataclasses.replace(_spec(task_port=first), port_retries=1)
    with _listen(first):
        env = _task_environment.start_environment(spec, 2, "127.0.0.1", "127.0.0.1",
                                                  "task attempt 1", 5)
        try:
            assert env.address == ("127.0.0.1", first + 1)
            assert env.peer_id == "task attempt 1"
        finally:
            env.close()


def test_a_task_server_on_an_address_of_another_host_says_so():
    with pytest.raises(RemoteConnectionError, match=f"cannot bind {ELSEWHERE}.*not an address "
                                                    "of this host.*advertise="):
        _task_environment.start_environment(_spec(), 2, ELSEWHERE, ELSEWHERE, "", 5)


# ---- the rendezvous, unreachable --------------------------------------------------------------

def _register(address, **kw):
    return _rendezvous.register(address, SECRET, stage=1, task_attempt_id=0, index=0,
                                num_tasks=2, address="127.0.0.1:1", **kw)


def test_a_rendezvous_that_drops_connections_fails_within_the_connect_timeout():
    """A listener whose queue is full drops new connections (as a firewall
    does): the task gives up after connect_timeout, not timeout, and says
    where it could not connect and what to open."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    address = full.getsockname()
    filler = socket.create_connection(address, timeout=2)
    try:
        t0 = time.monotonic()
        with pytest.raises(RemoteConnectionError) as err:
            _register(address, timeout=30, connect_timeout=0.5)
        assert time.monotonic() - t0 < 5
        message = str(err.value)
        assert (f"could not connect to the exchange's rendezvous on the driver at "
                f"127.0.0.1:{address[1]} within 0.5 s (connect_timeout): the driver must accept "
                f"connections from the executors on that port") in message
        assert "rendezvous_port" in message
    finally:
        filler.close()
        full.close()


def test_a_rendezvous_that_never_answers_the_handshake_fails_within_the_connect_timeout():
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(4)
    try:
        t0 = time.monotonic()
        with pytest.raises(AuthenticationError, match="the exchange's rendezvous on the driver "
                                                      "at 127.0.0.1:.*in time"):
            _register(mute.getsockname(), timeout=30, connect_timeout=0.5)
        assert time.monotonic() - t0 < 5
    finally:
        mute.close()


def test_the_rendezvous_answers_the_task_attempt_ids():
    with _rendezvous.RendezvousServer(SECRET, 2, timeout=5) as server:
        out = {}

        def reg(i):
            out[i] = _rendezvous.register(server.address, SECRET, stage=3,
                                          task_attempt_id=40 + i, index=i, num_tasks=2,
                                          address=f"10.0.0.{i}:7100", timeout=5)

        threads = [threading.Thread(target=reg, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert out[0] == out[1] == ["10.0.0.0:7100", "10.0.0.1:7100"]
        assert out[0].task_attempt_ids == [40, 41]
        assert server.stages() == [3]


# ---- errors that name the peer ----------------------------------------------------------------

def test_connection_errors_name_both_tasks_and_the_direction():
    peers = _task_peers.Peers(0, ["10.0.0.1:7100", "10.0.0.2:7100", "10.0.0.2:7101"])
    timed_out = peers.named(RemoteConnectionError("cannot connect to 10.0.0.2:7100: timed out"),
                            connecting=True, connect_timeout=3)
    assert str(timed_out).startswith(
        "task 0 at 10.0.0.1:7100 could not connect to task 1 at 10.0.0.2:7100 to read its "
        "output (within connect_timeout=3 s)")
    assert "task_port=" in str(timed_out)
    refused = peers.named(RemoteConnectionError(
        "cannot connect to 10.0.0.2:7101: [Errno 111] Connection refused"), connecting=True,
        connect_timeout=3)
    assert "could not connect to task 2 at 10.0.0.2:7101" in str(refused)
    assert "nothing listens there any more" in str(refused)
    dropped = peers.named(RemoteConnectionError(
        "connection to 10.0.0.2:7101: the peer closed the connection"))
    assert str(dropped).startswith("task 0 at 10.0.0.1:7100 lost its connection to task 2 at "
                                   "10.0.0.2:7101 while reading its output")
    mismatched = peers.named(AuthenticationError("connecting to 10.0.0.2:7100: ..."),
                             connecting=True, connect_timeout=3)
    assert isinstance(mismatched, AuthenticationError)
    # an address that only starts like a peer's is not that peer
    assert peers.named(RemoteConnectionError("cannot connect to 10.0.0.2:71000: x")) is None
    assert peers.named(RemoteConnectionError("no address at all")) is None


def test_a_dial_error_names_the_peer_dialed_whatever_its_message_names():
    """The peer named is the one dialed, even when the message names
    another's address (or this task's own)."""
    peers = _task_peers.Peers(1, ["10.0.0.1:7100", "10.0.0.2:7100", "10.0.0.3:7100"])
    named = peers.named(RemoteConnectionError(
        "cannot connect to 10.0.0.3:7100: the peer at 10.0.0.2:7100 ... timed out"),
        connecting=True, connect_timeout=2, peer=2)
    assert str(named).startswith("task 1 at 10.0.0.2:7100 could not connect to task 2 at "
                                 "10.0.0.3:7100 to read its output (within connect_timeout=2 s)")
    # a message naming only this task's own address names no peer
    assert peers.named(RemoteConnectionError("connection to 10.0.0.2:7100: gone")) is None


def test_a_peer_whose_connection_did_not_arrive_gets_the_firewall_hint():
    """The side whose connection the peer refused (it keeps its own) and
    whose peer's connection never comes says what the side that timed out
    says: a firewall, and task_port=."""
    peers = _task_peers.Peers(0, ["10.0.0.1:7100", "10.0.0.2:7100"])
    named = peers.named(RemoteConnectionError(
        "connecting to 10.0.0.2:7100: the peer keeps its own connection to this process, "
        "which did not arrive within 2 s"), connecting=True, connect_timeout=2, peer=1)
    assert "(within connect_timeout=2 s)" in str(named)
    assert "task_port=" in str(named) and "firewall" in str(named)


def test_tasks_that_advertise_one_address_are_named_before_any_dial():
    peers = _task_peers.Peers(2, ["10.0.0.1:7100", "10.0.0.2:7100", "10.0.0.1:7100"])
    with pytest.raises(RemoteConnectionError, match=r"task 0 and task 2 of the exchange "
                                                    r"advertise the same address, "
                                                    r"10\.0\.0\.1:7100 \(seen from task 2\)"):
        peers.check_distinct()
    _task_peers.Peers(0, ["10.0.0.1:7100", "10.0.0.1:7101"]).check_distinct()


class _Channel:
    pass


class _FakeGate:
    def __init__(self, n):
        self.channels = [_Channel() for _ in range(n)]
        self.num_channels = n


class _FakeEnv:
    """An environment whose dial to ``refusing`` fails as the dialer's do."""

    def __init__(self, refusing, message="timed out"):
        self.refusing, self.message = refusing, message
        self.dialed = []

    def update_input_channel(self, channel, address):
        self.dialed.append(address)
        if address == self.refusing:
            raise RemoteConnectionError(f"cannot connect to {address}: {self.message}")

    def expect_peers(self, peers):
        self.expected = peers


@pytest.mark.parametrize("path", ["monitor", "connector"])
def test_every_path_that_dials_names_the_peer_dialed(monkeypatch, path):
    """The channels a task connects before its records flow (with a
    monitor) and those its Connector thread connects while they flow: an
    error connecting names this task and the peer dialed, with the hint."""
    addresses = ["10.0.0.1:7100", "10.0.0.2:7100", "10.0.0.3:7100"]
    env, gate = _FakeEnv("10.0.0.3:7100"), _FakeGate(3)
    spec = _spec(connect_timeout=2.0)
    if path == "monitor":
        with pytest.raises(RemoteConnectionError) as err:
            _task_peers.connect_channels(env, gate, _task_peers.Peers(1, addresses), 2.0)
        error = err.value
    else:
        class Ctx(_FakeTaskContext):
            def partitionId(self):
                return 1

            def allGather(self, message):
                import json
                tid = json.loads(message)["task_attempt_id"]
                return [json.dumps({"index": i, "address": a, "task_attempt_id": tid + i})
                        for i, a in enumerate(addresses)]

        monkeypatch.setattr(_task_peers, "UnknownInputChannel", _Channel)
        failed = []
        for channel in gate.channels:
            channel.fail = failed.append
        connector = _task_peers.Connector(spec, Ctx(), env, gate, 7, addresses[1], None)
        connector.run()
        error = connector.error
        assert failed and all(f is error for f in failed)
    assert env.dialed == ["10.0.0.1:7100", "10.0.0.3:7100"]
    assert str(error).startswith("task 1 at 10.0.0.2:7100 could not connect to task 2 at "
                                 "10.0.0.3:7100 to read its output (within connect_timeout=2 s)")
    assert "task_port=" in str(error)


# ---- the watch over stage attempts that cannot get their slots --------------------------------

class _FakeSpark:
    """The parts of a SparkContext the watch asks: a status tracker, the
    slots, and cancelStage."""

    def __init__(self):
        self.active = {}                  # stage -> [num_tasks, active tasks, attempt]
        self.slots = 4
        self.cancelled = []
        outer = self

        class Info:
            def __init__(self, row):
                self.row = row

            def numTasks(self):
                return self.row[0]

            def numActiveTasks(self):
                return self.row[1]

            def currentAttemptId(self):
                return self.row[2]

        class Tracker:
            def getActiveStageIds(self):
                return list(outer.active)

            def getStageInfo(self, stage):
                row = outer.active.get(stage)
                return None if row is None else Info(row)

        class Jsc:
            def statusTracker(self):
                return Tracker()

            def sc(self):
                return self

            def resourceProfileManager(self):
                return self

            def defaultResourceProfile(self):
                return None

            def maxNumConcurrentTasks(self, profile):
                return outer.slots

            def cancelStage(self, stage, reason):
                outer.cancelled.append((stage, reason))

        self._jsc = Jsc()


class _FakeServer:
    closed = False

    def __init__(self, stages):
        self._stages = stages

    def stages(self):
        return list(self._stages)


def test_the_watch_cancels_an_attempt_that_cannot_get_its_slots_after_the_timeout():
    import weakref

    sc, server = _FakeSpark(), _FakeServer([5])
    ref, since = weakref.ref(server), {}
    sc.active[5] = [4, 0, 1]          # attempt 1 of stage 5: 4 tasks, none running
    sc.slots = 2                      # a host was lost
    _slot_watch.SlotWatch._check(ref, sc, 4, 0.3, since)
    assert sc.cancelled == []
    time.sleep(0.35)
    _slot_watch.SlotWatch._check(ref, sc, 4, 0.3, since)
    [(stage, reason)] = sc.cancelled
    assert stage == 5
    assert reason.startswith("flinkbuf: attempt 1 of stage 5, a barrier stage of an exchange, "
                             "needs 4 task slots at once and the cluster has 2 (a host or an "
                             "executor was lost): the stage has waited for them longer than its "
                             "timeout (0.3 s)")


def test_the_watch_counts_from_the_first_look_that_found_the_stage_waiting():
    """A retried attempt waits while the cluster still counts the slots of
    a host that stopped answering (its executor not lost yet), and Spark
    starts another attempt when it loses it: once the slots are short, the
    stage is cancelled at once if it has waited for the timeout already."""
    import weakref

    sc, server = _FakeSpark(), _FakeServer([5])
    ref, since = weakref.ref(server), {}
    sc.active[5] = [4, 0, 1]          # attempt 1 waits; the slots look enough
    _slot_watch.SlotWatch._check(ref, sc, 4, 0.3, since)
    time.sleep(0.35)
    _slot_watch.SlotWatch._check(ref, sc, 4, 0.3, since)
    assert sc.cancelled == []         # the slots are there (Spark says)
    sc.active[5] = [4, 0, 2]          # the executor lost: another attempt, slots short
    sc.slots = 2
    _slot_watch.SlotWatch._check(ref, sc, 4, 0.3, since)
    [(stage, reason)] = sc.cancelled
    assert stage == 5 and reason.startswith("flinkbuf: attempt 2 of stage 5"), reason


def test_the_watch_lets_an_attempt_run_when_its_slots_come_back_in_time():
    import weakref

    sc, server = _FakeSpark(), _FakeServer([5, 6])
    ref, since = weakref.ref(server), {}
    sc.active[5] = [4, 0, 1]
    sc.slots = 2
    _slot_watch.SlotWatch._check(ref, sc, 4, 0.3, since)
    sc.slots = 4                      # the host came back
    time.sleep(0.35)
    _slot_watch.SlotWatch._check(ref, sc, 4, 0.3, since)
    assert sc.cancelled == []
    sc.active[5] = [4, 4, 1]          # the attempt runs
    _slot_watch.SlotWatch._check(ref, sc, 4, 0.3, since)
    assert since == {}                # its clock starts afresh if it waits again
    sc.slots = 2
    sc.active[6] = [4, 0, 0]          # stage 6: slots enough at submission? not now
    del sc.active[6]                  # ... and no longer active: nothing to watch
    time.sleep(0.35)
    _slot_watch.SlotWatch._check(ref, sc, 4, 0.3, since)
    assert sc.cancelled == []
