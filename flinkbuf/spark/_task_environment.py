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
from flinkbuf.network.addresses import is_host_address, is_wildcard, source_address
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


def own_host(ctx, index, driver=None):
    """An address of this task's host for its peers, as Spark's own
    services on the executor use: ``SPARK_LOCAL_IP`` (set on the executor's
    host); else the executor's address in the task infos when it is one of
    this host's (it is the address the driver saw the executor's
    connection come from: behind a NAT or with several interfaces, another
    host's); else the address this host reaches the driver (``driver``,
    ``(host, port)``) from; else the address of this host's name."""
    local_ip = os.environ.get("SPARK_LOCAL_IP", "").strip().strip("[]")
    if local_ip and is_host_address(local_ip):
        return local_ip
    try:
        seen = ctx.getTaskInfos()[index].address.rpartition(":")[0].strip("[]")
    except Exception:       # noqa: BLE001 - fall back below
        seen = ""
    if is_host_address(seen):
        return seen
    if driver is not None:
        source = source_address(driver)
        if source is not None:
            return source
    try:
        name = socket.gethostbyname(socket.gethostname())
    except OSError:
        name = ""
    if is_host_address(name):
        return name
    raise RemoteConnectionError(
        f"task {index} found no address of its own host for its peers to reach it at "
        f"(SPARK_LOCAL_IP is {local_ip or 'not set'}, Spark saw the executor at "
        f"{seen or 'an unknown address'}): set SPARK_LOCAL_IP on the executor's host, or "
        f"host= and advertise=")


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
