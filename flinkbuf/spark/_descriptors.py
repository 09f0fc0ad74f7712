"""Room for the descriptors of a wide exchange: a task holds a few per
peer connection, the driver's rendezvous one per task.  This process's
soft limit of open descriptors (``RLIMIT_NOFILE``) is raised, never above
its hard limit, when what an exchange needs does not fit in it (the JVM
raises its own to the hard limit at start; a Python process keeps the
soft limit it was started with, often 1,024)."""

import logging
import os
import resource

_LOG = logging.getLogger("flinkbuf.spark")

# What a task's environment holds: at most this many per connection (a
# shared-memory one: its socket, its region and its rings' signals, 5 as
# bench/exchange_width.py counts them, and one to spare), and this many of
# its own (listening sockets, the acceptor's selector and wake-up pair).
PER_CONNECTION = 6
OF_ENVIRONMENT = 16


def open_descriptors():
    """The descriptors this process has open now (0 where /proc does not tell)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def make_room(more, what):
    """Let ``more`` descriptors open beside those open now: the soft limit
    raised toward the hard one if it is lower, and a warning naming
    ``what`` needs them when even the hard limit is.  Returns the soft
    limit."""
    need = open_descriptors() + more
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError):
            pass
    if soft < need:
        _LOG.warning("flinkbuf: %s needs about %d open descriptors, and this process may open "
                     "%d (ulimit -n): raise the limit, or connections will be refused",
                     what, need, soft)
    return soft
