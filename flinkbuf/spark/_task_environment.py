"""Where a task of an exchange listens and what its peers dial: an address
of the task's own host (:func:`own_host`), the bound and the advertised
host (:func:`task_addresses`), and the task's NetworkEnvironment on them
(:func:`start_environment`)."""

import errno
import os
import socket

from flinkbuf.errors import RemoteConnectionError
from flinkbuf.io import task_segments
from flinkbuf.network import NetworkEnvironment
from flinkbuf.network.addresses import (
    host_address,
    is_host_address,
    is_loopback,
    is_wildcard,
    source_address,
)
from flinkbuf.network.config import MAX_CONNECTIONS, MAX_PENDING_HANDSHAKES
from flinkbuf.spark import _descriptors, _rendezvous

# Connections and handshakes a task's environment has room for beyond what
# its peers need.
CONNECTION_MARGIN = 16


def connection_caps(n):
    """``(max_connections, max_pending_handshakes)`` of the environment of
    a task of an ``n``-task exchange, never below the environment's
    defaults: its ``n - 1`` peers' connections both ways (one per peer
    once connected; two for a moment when a peer and the task dial each
    other at once, the second then closes) and every peer handshaking at
    once, each with a margin."""
    peers = n - 1
    return (max(MAX_CONNECTIONS, 2 * peers + CONNECTION_MARGIN),
            max(MAX_PENDING_HANDSHAKES, peers + CONNECTION_MARGIN))


def choose_host(candidates, peer_hosts, here=(), is_own=is_host_address):
    """The address of this host a task advertises: the first of
    ``candidates`` (this host's addresses, best first; None for one not
    found) that its peers can reach.  A loopback address (127.0.0.1, or
    127.0.1.1 where a host's name maps there) reaches only this host: it
    is passed over unless every peer is on this host, that is each of
    ``peer_hosts`` (where Spark says the other tasks' executors are) is
    loopback, one of ``here`` (what names this host: its executor's
    address as Spark tells it) or an address of this host (``is_own``).
    None when no candidate fits."""
    peers_here = all(is_loopback(h) or h in here or is_own(h) for h in peer_hosts)
    for host in candidates:
        if host and (peers_here or not is_loopback(host)):
            return host
    return None


def _info_hosts(ctx):
    """The host of each task's executor, by index, as Spark tells it."""
    try:
        return [i.address.rpartition(":")[0].strip("[]") for i in ctx.getTaskInfos()]
    except Exception:       # noqa: BLE001 - none known
        return []


def _named_host():
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return ""


def own_host(ctx, index, driver=None):
    """An address of this task's host for its peers, as Spark's own
    services on the executor use: ``SPARK_LOCAL_IP`` (set on the executor's
    host); else, by :func:`choose_host` (never loopback when a peer is on
    another host), the executor's address in the task infos when it is one
    of this host's (it is the address the driver saw the executor's
    connection come from: behind a NAT or with several interfaces, another
    host's), the address this host reaches the driver (``driver``,
    ``(host, port)``) from, the one it reaches the other tasks' executors
    (and its own as the driver saw it) from, the address of this host's
    name, and the one it reaches the default route from."""
    local_ip = os.environ.get("SPARK_LOCAL_IP", "").strip().strip("[]")
    if local_ip and is_host_address(local_ip):
        return local_ip
    hosts = _info_hosts(ctx)
    seen = hosts[index] if index < len(hosts) else ""
    peers = [h for i, h in enumerate(hosts) if i != index and h]
    own = seen if is_host_address(seen) else None
    if own is not None and not is_loopback(own):
        return own                      # the first candidate, and any peer reaches it
    targets = [(h, 9) for h in dict.fromkeys(peers + [seen])
               if h and h != own and not is_loopback(h)]
    routes = [source_address(t) for t in ([driver] if driver is not None else []) + targets]
    named = _named_host()
    chosen = choose_host([own, *routes, named if is_host_address(named) else None,
                          host_address()], peers, here=(seen,))
    if chosen is not None:
        return chosen
    raise RemoteConnectionError(
        f"task {index} found no address of its own host for its peers to reach it at "
        f"(SPARK_LOCAL_IP is {local_ip or 'not set'}, Spark saw the executor at "
        f"{seen or 'an unknown address'}, and every address found is loopback while a peer "
        f"is on another host): set SPARK_LOCAL_IP on the executor's host, or host= and "
        f"advertise=")


def task_addresses(ctx, index, spec):
    """``(bind, advertised)``: the host this task's server binds (``host``
    if given, else :func:`own_host`) and the host its peers dial (from
    ``advertise`` if it names one, else the bound host, or the own one
    when the bind is on all interfaces; never a wildcard)."""
    options = spec.options
    own = None
    bind = options.host
    if not bind:
        bind = own = own_host(ctx, index, spec.rendezvous)
    advertised = None
    if isinstance(options.advertise, str):
        advertised = options.advertise
    elif options.advertise is not None:
        if own is None:
            own = bind if not is_wildcard(bind) else own_host(ctx, index, spec.rendezvous)
        advertised = options.advertise.get(own)
    if advertised is None:
        advertised = bind if not is_wildcard(bind) else (
            own or own_host(ctx, index, spec.rendezvous))
    return bind, advertised


def peer_id(task_attempt_id):
    """The name a task says in every handshake: its task attempt."""
    return f"task attempt {task_attempt_id}"


def start_environment(spec, n, bind, advertised, peer, out_buffers):
    """The task's NetworkEnvironment (``peer``: its peer id), its server on
    ``bind`` at ``task_port`` or, when taken, one of the next
    ``port_retries`` ports; its waits bounded by the spec's timeouts, its
    connections and pending handshakes by :func:`connection_caps`, with
    room for its descriptors (:func:`~flinkbuf.spark._descriptors.make_room`)."""
    options, timeouts = spec.options, spec.timeouts
    max_connections, max_pending = connection_caps(n)
    _descriptors.make_room(_descriptors.OF_ENVIRONMENT + _descriptors.PER_CONNECTION * (n - 1),
                           f"a task of a {n}-task exchange")
    segments = task_segments([out_buffers], [n - 1],
                             exclusive_buffers_per_channel=options.buffers_per_channel,
                             floating_buffers_per_gate=options.floating_buffers)

    def start(port):
        return NetworkEnvironment(
            segments, options.segment_size, host=bind, port=port, secret=spec.secret,
            exclusive_buffers_per_channel=options.buffers_per_channel,
            floating_buffers_per_gate=options.floating_buffers,
            connect_timeout=timeouts.connect, request_timeout=timeouts.request,
            io_timeout=timeouts.io, encryption=spec.encryption, advertise=advertised,
            peer_id=peer, buffer_debloat=options.buffer_debloat,
            max_connections=max_connections, max_pending_handshakes=max_pending)

    try:
        return _rendezvous.bind_in_range(start, bind, options.task_port, spec.port_retries,
                                         "the exchange's task server", "task_port")
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise RemoteConnectionError(
                f"the exchange's task server cannot bind {bind} ({exc}): it is not an "
                f"address of this host (host= names the address to bind, advertise= the one "
                f"peers dial)") from None
        raise
