"""Logging at a limited rate per cause, for servers that any peer can make
log (a refused handshake, a dropped socket): a flood of bad peers costs a
few lines, not one per peer."""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

_DIGITS = re.compile(r"\d+")


class LogLimiter:
    """Log through ``logger``, per cause a burst of ``burst`` messages, then
    one per ``interval`` seconds; a message logged after some were left out
    says how many.  A cause is a string; its digits do not count (so that
    addresses, ports and counts in it make no new cause).  Thread-safe, and
    callable with any of the caller's locks held."""

    MAX_CAUSES = 1024                   # past this, the oldest budgets are forgotten

    def __init__(self, logger: logging.Logger, burst: int = 10, interval: float = 5.0) -> None:
        self._log = logger
        self.burst = burst
        self.interval = interval
        self._lock = threading.Lock()
        self._budgets: dict[str, tuple[float, float, int]] = {}   # tokens, when, left out

    def __call__(self, level: int, cause: str, msg: str, *args: Any,
                 exc_info: bool = False) -> None:
        cause = _DIGITS.sub("#", cause)
        now = time.monotonic()
        with self._lock:
            tokens, stamp, left_out = self._budgets.pop(cause, (self.burst, now, 0))
            tokens = min(self.burst, tokens + (now - stamp) / self.interval)
            if tokens < 1:
                self._budgets[cause] = (tokens, now, left_out + 1)
                return
            self._budgets[cause] = (tokens - 1, now, 0)
            while len(self._budgets) > self.MAX_CAUSES:
                del self._budgets[next(iter(self._budgets))]
        if left_out:
            msg += " (and %d more like it, not logged)"
            args += (left_out,)
        self._log.log(level, msg, *args, exc_info=exc_info)
