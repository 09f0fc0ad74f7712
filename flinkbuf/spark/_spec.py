"""What the driver hands to every task of an exchange, as frozen dataclasses
that travel to the tasks in the stage's closure (they pickle, and nothing
changes them on the way):

* :class:`ExchangeOptions` -- the options the user chose, checked on the
  driver before anything starts (:func:`check_options`), the session's
  defaults (``encryption``, ``port_retries``) still None;
* :class:`Timeouts` -- the bound of each of the exchange's waits, all
  derived in one place from the user's ``timeout`` and ``connect_timeout``;
* :class:`ExchangeSpec` -- the options with what the driver decided for
  this exchange (its id and secret, the session's defaults resolved, where
  its rendezvous and its live view are), made once (:func:`make_spec`).
"""

import dataclasses
import secrets
from collections.abc import Callable
from typing import Any

from flinkbuf.checks import check_choice, check_int, check_seconds
from flinkbuf.io import BufferDebloatConfig, default_max_parallelism
from flinkbuf.io.producer import emit_all
from flinkbuf.network.addresses import is_wildcard
from flinkbuf.network.config import debloat_config
from flinkbuf.serialization import CODECS
from flinkbuf.spark._reports import Target

# How the tasks of an exchange learn each other's addresses.
RENDEZVOUS = ("driver", "barrier")

# The selectors by name: what pipelined_exchange accepts besides a callable.
# Each but "hash" is the RecordWriter's selector of that name (Flink's
# meanings: "rebalance" is round robin, as "round_robin"; "backlog_aware"
# is the round robin that steers around a consumer whose backlog is full).
SELECTORS = ("hash", "round_robin", "rebalance", "backlog_aware", "broadcast")


@dataclasses.dataclass(frozen=True)
class Timeouts:
    """How long each wait of an exchange may last, in seconds.  Made by
    :meth:`derive` alone, from the two bounds a user gives: every one is
    the exchange's ``timeout`` but ``connect``, its ``connect_timeout``.

    ``connect``: a task connecting to a peer or to the driver's rendezvous,
    the handshake, and the rendezvous's acknowledgement of a registration.
    ``request``: a peer's partition request waiting for the partition to be
    registered (the environment's ``request_timeout``).
    ``io``: a connection stalled in the middle of a frame (the environment's
    ``io_timeout``); at a task's end, its producer thread's end and its
    peers taking the rest of its output, each of which fails only after
    this long without progress; the pauses of a failing task (for its
    error to reach its peers, before it reports a peer that went away)
    never last longer.
    ``slots``: on the driver, the wait for a cluster's executors to offer
    a slot for every task before the job runs, and how long a stage
    attempt may go without its slots before the driver cancels it.
    ``rendezvous``: a task's wait for the rendezvous's answer (every task
    of its stage attempt registered), each step of a registration on the
    driver, and how long a rendezvous whose exchange is gone stays open
    without a registration."""

    connect: float
    request: float
    io: float
    slots: float
    rendezvous: float

    @classmethod
    def derive(cls, timeout, connect_timeout):
        """The bounds of an exchange given ``timeout`` and
        ``connect_timeout`` (checked seconds)."""
        return cls(connect=connect_timeout, request=timeout, io=timeout, slots=timeout,
                   rendezvous=timeout)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExchangeOptions:
    """An exchange's options, checked (:func:`check_options`): what each
    task does (``fn``; ``produce(writer, iterator)`` writes its input,
    ``read(task)`` its records to ``fn``, None: the gate's records; with
    the ``arrow`` codec, ``produce`` writes through a
    :class:`~flinkbuf.io.BatchWriter` by the column ``key``), how it
    routes and frames records, its buffers, where it binds and what it
    advertises, how tasks find each other, its bounds.  ``encryption`` and
    ``port_retries`` are the user's: None takes the session's."""

    fn: Callable[..., Any] | None
    produce: Callable[..., Any]
    read: Callable[..., Any] | None
    selector: str | Callable[..., Any]
    key: int | str | Callable[..., Any] | None
    codec: str
    segment_size: int
    buffers_per_channel: int
    floating_buffers: int
    buffer_timeout: float | None
    max_record_size: int
    max_parallelism: int
    host: str | None
    advertise: str | dict[str, str] | None
    task_port: int
    rendezvous_port: int
    port_retries: int | None
    encryption: bool | None
    rendezvous: str
    monitor: Callable[..., Any] | None
    timeouts: Timeouts
    buffer_debloat: BufferDebloatConfig | None = None   # None: the task environment's default


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExchangeSpec:
    """Everything a task of an exchange needs, made once on the driver
    (:func:`make_spec`): the ``options``, the exchange's id and secret
    (made for this exchange only), whether connections are sealed
    (``encryption``, the session's default resolved), the ports a task
    may try past ``task_port`` (``port_retries``), the driver's rendezvous
    ``(host, port)`` (None: the tasks use ``allGather``), and where the
    tasks report to a live view (``live``, None: nowhere)."""

    options: ExchangeOptions
    exchange_id: str
    secret: bytes = dataclasses.field(repr=False)
    encryption: bool | None
    port_retries: int
    rendezvous: tuple[str, int] | None
    live: Target | None = None

    @property
    def timeouts(self):
        return self.options.timeouts


def new_secret():
    """A fresh secret for one exchange."""
    return secrets.token_bytes(32)


def new_exchange_id():
    return f"flinkbuf-exchange-{secrets.token_hex(8)}"


def make_spec(options, *, secret=None, exchange_id=None, encryption=None, port_retries=None,
              rendezvous=None, live=None):
    """The :class:`ExchangeSpec` of ``options``: a fresh secret and id
    unless given, ``encryption`` and ``port_retries`` as the options say
    unless given (no ``port_retries``: none), no rendezvous and no live
    view unless given."""
    return ExchangeSpec(
        options=options,
        exchange_id=new_exchange_id() if exchange_id is None else exchange_id,
        secret=new_secret() if secret is None else secret,
        encryption=options.encryption if encryption is None else encryption,
        port_retries=(options.port_retries or 0) if port_retries is None else port_retries,
        rendezvous=None if rendezvous is None else tuple(rendezvous),
        live=live)


def check_buffers(buffers_per_channel, floating_buffers):
    """Check an exchange's ``buffers_per_channel`` and ``floating_buffers``."""
    check_int(buffers_per_channel, "buffers_per_channel", 1, 1 << 16)
    check_int(floating_buffers, "floating_buffers", 0, 1 << 16)


def check_options(n, fn, *, num_partitions, key, selector, codec, segment_size,
                  buffers_per_channel, floating_buffers, buffer_timeout, max_record_size,
                  max_parallelism, host, timeout, monitor, rendezvous="driver",
                  produce=emit_all, read=None, encryption=None, advertise=None, task_port=0,
                  rendezvous_port=0, port_retries=None, connect_timeout=10.0,
                  buffer_debloat=None, buffer_debloat_target=None, buffer_debloat_period=None,
                  buffer_debloat_samples=None, buffer_debloat_threshold=None,
                  buffer_debloat_min_size=None):
    """Check the arguments of an exchange of ``n`` tasks (on the driver,
    before anything starts) and return its :class:`ExchangeOptions`."""
    if fn is not None and not callable(fn):
        raise TypeError(f"fn must be callable (iterator -> iterable) or None, got "
                        f"{type(fn).__name__}")
    if num_partitions is not None:
        check_int(num_partitions, "num_partitions", 1)
        if num_partitions != n:
            raise ValueError(
                f"num_partitions is {num_partitions} but the RDD has {n} partitions: a barrier "
                f"stage runs one task per input partition (repartition the RDD first)")
    check_choice(codec, "codec", CODECS)
    if codec == "arrow" and produce is emit_all:
        raise ValueError("the arrow codec carries column batches, which arrow_exchange "
                         "exchanges (a DataFrame's): use arrow_exchange, or another codec")
    selector = _check_selector(selector, key, codec)
    check_int(segment_size, "segment_size", 64, 1 << 30)
    check_buffers(buffers_per_channel, floating_buffers)
    check_seconds(buffer_timeout, "buffer_timeout", allow_none=True)
    check_int(max_record_size, "max_record_size", 1)
    if max_parallelism is None:
        max_parallelism = default_max_parallelism(n)
    else:
        check_int(max_parallelism, "max_parallelism", n, 32768)
    if host is not None and not isinstance(host, str):
        raise TypeError(f"host must be a str or None, got {type(host).__name__}")
    advertise = _check_advertise(advertise)
    check_int(task_port, "task_port", 0, 65535)
    check_int(rendezvous_port, "rendezvous_port", 0, 65535)
    if port_retries is not None:
        check_int(port_retries, "port_retries", 0, 65535)
    connect_timeout = check_seconds(connect_timeout, "connect_timeout")
    timeout = check_seconds(timeout, "timeout")
    if monitor is not None and not callable(monitor):
        raise TypeError(f"monitor must be callable or None, got {type(monitor).__name__}")
    check_choice(rendezvous, "rendezvous", RENDEZVOUS)
    if encryption is not None and not isinstance(encryption, bool):
        raise TypeError(f"encryption must be True, False or None, got "
                        f"{type(encryption).__name__}")
    debloat = {"buffer_debloat": buffer_debloat, "buffer_debloat_target": buffer_debloat_target,
               "buffer_debloat_period": buffer_debloat_period,
               "buffer_debloat_samples": buffer_debloat_samples,
               "buffer_debloat_threshold": buffer_debloat_threshold,
               "buffer_debloat_min_size": buffer_debloat_min_size}
    return ExchangeOptions(
        buffer_debloat=(None if all(v is None for v in debloat.values())
                        else debloat_config(debloat)),
        fn=fn, produce=produce, read=read, selector=selector, key=key, codec=codec,
        segment_size=segment_size, buffers_per_channel=buffers_per_channel,
        floating_buffers=floating_buffers, buffer_timeout=buffer_timeout,
        max_record_size=max_record_size, max_parallelism=max_parallelism, host=host,
        advertise=advertise, task_port=task_port, rendezvous_port=rendezvous_port,
        port_retries=port_retries, encryption=encryption, rendezvous=rendezvous,
        monitor=monitor, timeouts=Timeouts.derive(timeout, connect_timeout))


def _check_selector(selector, key, codec):
    """``selector`` as a task takes it (``"-"`` read as ``"_"``), checked
    with ``key`` (for the arrow codec, a column name)."""
    if isinstance(selector, str):
        selector = selector.replace("-", "_")
    if not (callable(selector) or selector in SELECTORS):
        raise ValueError(f"selector must be one of {', '.join(SELECTORS)} or a callable "
                         f"(record, num_partitions) -> int, got {selector!r}")
    if key is not None:
        if selector != "hash":
            raise ValueError(f"key applies to the hash selector only, not to {selector!r}")
        if codec == "arrow":
            if not isinstance(key, str):
                raise TypeError(f"key must be a column name, got {type(key).__name__}")
        elif not callable(key):
            check_int(key, "key", 0)
    return selector


def _check_advertise(advertise):
    """``advertise`` of an exchange: None, a host, or a dict of a host's own
    address to the one its tasks advertise (a copy)."""
    def host(value, name):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        if is_wildcard(value.strip("[]")):
            raise ValueError(f"{name} must be an address peers can dial, not {value!r}")
        return value.strip("[]")

    if advertise is None:
        return None
    if isinstance(advertise, str):
        return host(advertise, "advertise")
    if isinstance(advertise, dict):
        return {host(k, "a key of advertise"): host(v, f"advertise[{k!r}]")
                for k, v in advertise.items()}
    raise TypeError(f"advertise must be a host, a dict of host -> host or None, got "
                    f"{type(advertise).__name__}")
