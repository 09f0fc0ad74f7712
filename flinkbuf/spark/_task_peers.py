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


def raise_connecting(peers, exc, connect_timeout):
    """Raise ``exc``, an error connecting to a peer, with the peer named
    (as it is if its message names none)."""
    named = peers.named(exc, connecting=True, connect_timeout=connect_timeout)
    if named is None:
        raise exc
    raise named from exc


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
            for i, channel in enumerate(gate.channels):
                if i == index:
                    continue
                try:
                    env.update_input_channel(channel, addresses[i])
                except RemoteConnectionError as exc:
                    raise_connecting(peers, exc, spec.timeouts.connect)
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

    def _peer_in(self, text):
        for j, address in enumerate(self.addresses):
            if j != self.index and address and re.search(
                    rf"(?<![\w.:]){re.escape(address)}(?!\d)", text):
                return j
        return None

    def named(self, exc, connecting=False, connect_timeout=None):
        """``exc`` (a RemoteConnectionError) with the task at the other end
        named, and which way: this task connecting to it, or reading from
        it; None when its message names no peer."""
        text = str(exc)
        j = self._peer_in(text)
        if j is None:
            return None
        me = f"task {self.index} at {self.addresses[self.index]}"
        peer = f"task {j} at {self.addresses[j]}"
        if connecting:
            low = text.lower()
            if "timed out" in low or "did not complete the handshake in time" in low:
                hint = (f" (within connect_timeout={connect_timeout:g} s): connections from "
                        f"this host to that one's task ports must be let through (pin them with "
                        f"task_port= and open them)")
            elif "refused" in low and "server refused" not in low:
                hint = (": nothing listens there any more (the task ended), or a firewall "
                        "rejects connections to that host's task ports (pin them with "
                        "task_port= and open them)")
            else:
                hint = ""
            message = f"{me} could not connect to {peer} to read its output{hint}: {text}"
        else:
            message = f"{me} lost its connection to {peer} while reading its output: {text}"
        kind = AuthenticationError if isinstance(exc, AuthenticationError) else \
            RemoteConnectionError
        return kind(message)


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
