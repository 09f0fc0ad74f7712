"""Input gates over local, remote and not-yet-known channels (Flink's
``SingleInputGateFactory``): what a network environment's
``create_input_gate`` and ``update_input_channel`` do."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Union

from flinkbuf.buffer import NetworkBufferPool
from flinkbuf.errors import EnvironmentClosedError
from flinkbuf.io import BufferDebloatConfig, InputGate, LocalInputChannel, UnknownInputChannel
from flinkbuf.network._network import (
    Connection,
    FloatingBuffers,
    RemoteInputChannel,
    make_floating_buffers,
)
from flinkbuf.network.addresses import Address, OwnAddresses, format_address
from flinkbuf.network.config import NetworkConfig
from flinkbuf.network.partitions import PartitionRegistry

if TYPE_CHECKING:
    from flinkbuf.serialization import CodecName

__all__ = ["ChannelSpec", "InputGateFactory"]

# A channel of create_input_gate: (address, partition id, subpartition).
ChannelSpec = tuple[Union[Address, None], str, int]
Channel = Union[LocalInputChannel, RemoteInputChannel, UnknownInputChannel]


def _parse(specs: Iterable[ChannelSpec]) -> list[tuple[str | None, str, int]]:
    parsed: list[tuple[str | None, str, int]] = []
    for spec in specs:
        if not isinstance(spec, (tuple, list)) or len(spec) != 3:
            raise TypeError(f"a channel spec is (address, partition_id, subpartition), "
                            f"got {spec!r}")
        address, partition_id, sub = spec
        if not isinstance(partition_id, str):
            raise TypeError(f"partition_id must be a str, got {type(partition_id).__name__}")
        if isinstance(sub, bool) or not isinstance(sub, int) or not 0 <= sub < 2 ** 32:
            raise ValueError(f"subpartition must be an int in [0, 2**32), got {sub!r}")
        parsed.append((None if address is None else format_address(address), partition_id, sub))
    if not parsed:
        raise ValueError("an input gate needs at least one channel")
    return parsed


class InputGateFactory:
    """Makes the input gates of one environment: a local channel for a
    partition registered here, a remote channel (over the connection
    ``connect(address)`` gives) with its exclusive buffers and its gate's
    floating ones for a partition of another process, and an unknown
    channel for one whose address is not known yet."""

    def __init__(self, config: NetworkConfig, pool: NetworkBufferPool, own: OwnAddresses,
                 partitions: PartitionRegistry,
                 connect: Callable[[str], Connection]) -> None:
        self._config = config
        self._pool = pool
        self._own = own
        self._partitions = partitions
        self._connect = connect
        self._lock = threading.Lock()
        # Unknown channels of gates made here, and the floating buffers of
        # their gate (the remote channel they may become borrows from them).
        self._unknown: weakref.WeakKeyDictionary[UnknownInputChannel, FloatingBuffers | None] = \
            weakref.WeakKeyDictionary()
        self._closed = False

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise EnvironmentClosedError

    def create_input_gate(self, specs: Iterable[ChannelSpec], *, codec: CodecName = "typed",
                          max_record_size: int = 64 << 20, name: str | None = None,
                          buffer_debloat: bool | BufferDebloatConfig | None = None
                          ) -> InputGate:
        """See :meth:`NetworkEnvironment.create_input_gate
        <flinkbuf.network.NetworkEnvironment.create_input_gate>`."""
        parsed = _parse(list(specs))
        debloat = self._config.buffer_debloat
        if isinstance(buffer_debloat, BufferDebloatConfig):
            debloat = buffer_debloat
        elif buffer_debloat is not None:
            debloat = BufferDebloatConfig.from_options(buffer_debloat, default=debloat)
        self._check_open()
        channels: list[Channel] = []
        floating: FloatingBuffers | None = None
        try:
            remote = [s for s in parsed if s[0] is None or not self._own.is_own(s[0])]
            if remote and self._config.floating_buffers_per_gate:
                n = self._config.floating_buffers_per_gate
                # Debloating gives floating buffers back as the gate needs fewer:
                # only one of them is required then.
                floating = make_floating_buffers(
                    self._pool.create_buffer_pool(1 if debloat.enabled else n, n))
            for address, partition_id, sub in parsed:
                if address is None:
                    unknown = UnknownInputChannel(partition_id, sub)
                    with self._lock:
                        self._unknown[unknown] = floating
                    channels.append(unknown)
                else:
                    channels.append(self._channel_for(address, partition_id, sub, floating))
            return InputGate(channels, codec=codec, max_record_size=max_record_size, name=name,
                             buffer_debloat=debloat)
        except BaseException:
            for ch in channels:
                if isinstance(ch, RemoteInputChannel):
                    ch._close()
            raise

    def update_input_channel(self, channel: UnknownInputChannel, address: Address) -> None:
        """See :meth:`NetworkEnvironment.update_input_channel
        <flinkbuf.network.NetworkEnvironment.update_input_channel>`."""
        if not isinstance(channel, UnknownInputChannel):
            raise TypeError(f"channel must be an UnknownInputChannel, got "
                            f"{type(channel).__name__}")
        address = format_address(address)
        with self._lock:
            if channel not in self._unknown:
                raise ValueError("the channel was not made by this environment's "
                                 "create_input_gate, or was updated already")
            floating = self._unknown[channel]
        if channel.channel is not None or channel.error is not None:
            raise ValueError(f"input channel {channel.index} was updated or failed already")
        self._check_open()
        real = self._channel_for(address, channel.partition_id, channel.subpartition, floating)
        try:
            channel.update(real)
        except BaseException:
            if isinstance(real, RemoteInputChannel) and real.index is None:
                real._close()           # never joined the gate: give it all back
            raise
        with self._lock:
            self._unknown.pop(channel, None)

    def _channel_for(self, address: str, partition_id: str, sub: int,
                     floating: FloatingBuffers | None) -> LocalInputChannel | RemoteInputChannel:
        """The channel reading subpartition ``sub`` of ``partition_id`` at
        ``address``: a local one for this environment's address, else a
        remote one (borrowing from ``floating``)."""
        timeout = self._config.request_timeout
        if self._own.is_own(address):
            return LocalInputChannel(self._partitions.wait_for(partition_id, timeout), sub)
        conn = self._connect(address)
        n = self._config.exclusive_buffers_per_channel
        exclusive = self._pool.create_buffer_pool(n, n)
        try:
            return RemoteInputChannel._open(conn, partition_id, sub, exclusive, floating,
                                            timeout, timeout)
        except BaseException:
            exclusive.destroy()
            raise
