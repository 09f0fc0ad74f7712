"""A task of an exchange and its peers: learning every task's address
(:func:`register`, :func:`gather`), connecting the gate's channels to them
while records already flow (:class:`Connector`), naming the peer in an
error about a connection (:class:`Peers`), and telling a task's own
failure from one that only says a peer went away (:func:`root_error`,
:func:`is_consequence`)."""

import json
import re
import threading

from flinkbuf.errors import (
    AuthenticationError,
    PartitionReleasedError,
    ProducerFailedError,
    RemoteConnectionError,
    RemoteError,
)
from flinkbuf.io import UnknownInputChannel
from flinkbuf.spark import _rendezvous
from flinkbuf.spark._task_environment import peer_id

# Errors that only say a peer went away, and how long a task that sees one
# waits before it fails (the peer's own failure, the cause, is reported first).
_CONSEQUENCES = (PartitionReleasedError, RemoteConnectionError)
_CONSEQUENCE_NAMES = frozenset(("PartitionReleasedError", "RemoteConnectionError",
                                "AuthenticationError"))
CONSEQUENCE_DELAY = 3.0


def register(spec, ctx, tid, published):
    """The task's registration at the driver's rendezvous, sent."""
    timeouts = spec.timeouts
    return _rendezvous.Registration(
        spec.rendezvous, spec.secret, stage=ctx.stageId(), task_attempt_id=tid,
        index=ctx.partitionId(), num_tasks=len(ctx.getTaskInfos()), address=published,
        timeout=timeouts.rendezvous, connect_timeout=timeouts.connect)


def gather(spec, ctx, index, n, tid, published, registration=None):
    """Every task's address and task attempt id, by index: from the
    driver's rendezvous (the answer to ``registration`` if it was sent
    already), or through Spark's ``allGather``."""
    if spec.rendezvous is not None:
        if registration is None:
            registration = register(spec, ctx, tid, published)
        addresses = registration.answer()
        return addresses, addresses.task_attempt_ids
    gathered = ctx.allGather(json.dumps({"index": index, "address": published,
                                         "task_attempt_id": tid}))
    addresses, tids = [None] * n, [None] * n
    for message in gathered:
        entry = json.loads(message)
        addresses[entry["index"]] = entry["address"]
        tids[entry["index"]] = entry["task_attempt_id"]
    return addresses, tids


def expect_peers(env, index, addresses, tids):
    """Tell ``env`` which task attempt each peer's address must be."""
    # Each peer is the task attempt that registered at its address: a
    # connection that reaches another (the same port on another host,
    # one advertised address for two hosts) is refused, both ways.
    env.expect_peers({addresses[i]: peer_id(tids[i])
                      for i in range(len(addresses)) if i != index})


def raise_connecting(peers, exc, connect_timeout, peer):
    """Raise ``exc``, an error connecting to task ``peer``, with this task
    and that peer named."""
    raise peers.named(exc, connecting=True, connect_timeout=connect_timeout, peer=peer) from exc


def connect_channels(env, gate, peers, connect_timeout):
    """Put a channel reading each peer in the place of the gate's unknown
    channel for it (the peers' addresses are ``peers``'s), one by one; an
    error connecting to one names it (:func:`raise_connecting`)."""
    peers.check_distinct()
    for i, channel in enumerate(gate.channels):
        if i == peers.index:
            continue
        try:
            env.update_input_channel(channel, peers.addresses[i])
        except RemoteConnectionError as exc:
            raise_connecting(peers, exc, connect_timeout, i)


class Connector(threading.Thread):
    """Connects a task's gate to its peers while records already flow:
    learns every task's address, then puts a channel reading each peer in
    the place of that peer's unknown channel.  On a failure, the channels
    still unknown fail with its error (peers named), which the gate raises
    to the task's reader."""

    def __init__(self, spec, ctx, env, gate, tid, published, registration):
        super().__init__(name=f"flinkbuf-exchange-connect-{ctx.partitionId()}", daemon=True)
        self._spec, self._ctx, self._env, self._gate = spec, ctx, env, gate
        self._tid, self._published = tid, published
        self._registration = registration
        self.peers = None
        self.error = None

    def run(self):
        spec, env, gate = self._spec, self._env, self._gate
        index, n = self._ctx.partitionId(), gate.num_channels
        try:
            addresses, tids = gather(spec, self._ctx, index, n, self._tid, self._published,
                                     self._registration)
            self.peers = peers = Peers(index, addresses)
            expect_peers(env, index, addresses, tids)
            connect_channels(env, gate, peers, spec.timeouts.connect)
        except BaseException as exc:     # noqa: BLE001 - the gate raises it to the reader
            self.error = exc
            for channel in gate.channels:
                if isinstance(channel, UnknownInputChannel):
                    channel.fail(exc)

    def cancel(self):
        """The task failed: stop waiting for the rendezvous's answer."""
        if self._registration is not None:
            self._registration.cancel()


class Peers:
    """The addresses of an exchange's tasks, seen from task ``index``: to
    name the peer and the direction in an error about a connection."""

    def __init__(self, index, addresses):
        self.index = index
        self.addresses = addresses

    def check_distinct(self):
        """RemoteConnectionError naming two tasks that advertise the same
        address (a peer would reach one for the other, or this task
        itself), if there are any."""
        first = {}
        for j, address in enumerate(self.addresses):
            if address in first:
                i = first[address]
                raise RemoteConnectionError(
                    f"task {i} and task {j} of the exchange advertise the same address, "
                    f"{address} (seen from task {self.index}): each task must advertise an "
                    f"address of its own host that its peers reach (set SPARK_LOCAL_IP on "
                    f"each executor's host, or host= and advertise=)")
            first[address] = j

    def _peer_in(self, text):
        own = self.addresses[self.index]
        for j, address in enumerate(self.addresses):
            if j != self.index and address and address != own and re.search(
                    rf"(?<![\w.:]){re.escape(address)}(?!\d)", text):
                return j
        return None

    def named(self, exc, connecting=False, connect_timeout=None, peer=None):
        """``exc`` (a RemoteConnectionError) with the task at the other end
        named, and which way: this task connecting to it, or reading from
        it.  ``peer``: the index of that task (connecting, the one dialed);
        by default the peer whose address the message names, and None when
        it names none."""
        text = str(exc)
        j = self._peer_in(text) if peer is None else peer
        if j is None:
            return None
        me = f"task {self.index} at {self.addresses[self.index]}"
        other = f"task {j} at {self.addresses[j]}"
        if connecting:
            message = (f"{me} could not connect to {other} to read its output"
                       f"{_connect_hint(text, connect_timeout)}: {text}")
        else:
            message = f"{me} lost its connection to {other} while reading its output: {text}"
        kind = AuthenticationError if isinstance(exc, AuthenticationError) else \
            RemoteConnectionError
        return kind(message)


def _connect_hint(text, connect_timeout):
    """What a connecting error's message (``text``) suggests to open."""
    low = text.lower()
    if ("timed out" in low or "did not complete the handshake in time" in low
            or "did not arrive" in low):
        return (f" (within connect_timeout={connect_timeout:g} s): connections from one of "
                f"these two hosts to the other's task ports must be let through (does a "
                f"firewall drop them? pin the ports with task_port= and open them)")
    if "refused" in low and "server refused" not in low:
        return (": nothing listens there any more (the task ended), or a firewall rejects "
                "connections to that host's task ports (pin them with task_port= and open "
                "them)")
    return ""


def root_error(consumer_error, producer_error):
    """The error a failing task raises: its own (its input's, its
    ``fn``'s, a peer's error that its gate carries) before one that only
    says that a peer went away (a released subpartition, a dropped
    connection)."""
    for error in (producer_error, consumer_error):
        if error is not None and not is_consequence(error):
            return error
    return consumer_error if consumer_error is not None else producer_error


def is_consequence(error, depth=0):
    """True for an error that only says a peer went away: a released
    subpartition, a dropped connection, or a producer (this task's own, or
    a peer's) that failed with one of those."""
    if isinstance(error, _CONSEQUENCES):
        return True
    if isinstance(error, RemoteError):
        return error.type_name in _CONSEQUENCE_NAMES
    if isinstance(error, ProducerFailedError) and depth < 8:
        return is_consequence(error.__cause__, depth + 1)
    return False
