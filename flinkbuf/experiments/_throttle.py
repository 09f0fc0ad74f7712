"""Holding a task's loop to a fraction of a reference rate (the blog's
``Thread.sleep()`` slow-downs), without bursts after a stall."""

import time


class Throttle:
    """Call :meth:`pace` with the number of records done since the last
    call; it sleeps whenever the loop runs ahead of ``limit_pct`` percent of
    ``full_rate`` records/s.  At 100 % (or more) it never sleeps.  A loop
    that falls behind (backpressured) is not allowed to catch up in a burst:
    after ``max_lag`` seconds behind, the schedule restarts from now."""

    def __init__(self, full_rate, limit_pct=100.0, max_lag=0.02):
        self.full_rate = float(full_rate)
        self.max_lag = max_lag
        self._limit = float(limit_pct)
        self._origin = time.perf_counter()
        self._done = 0

    @property
    def limit_pct(self):
        return self._limit

    def set_limit(self, pct, full_rate=None):
        """Change the limit (from any thread); the schedule restarts."""
        if full_rate is not None:
            self.full_rate = float(full_rate)
        self._limit = float(pct)
        self._origin = time.perf_counter()
        self._done = 0

    def pace(self, n):
        limit = self._limit
        if limit >= 100.0:
            return
        rate = self.full_rate * limit / 100.0
        self._done += n
        now = time.perf_counter()
        due = self._origin + self._done / rate
        if due > now:
            time.sleep(due - now)
        elif now - due > self.max_lag:
            self._origin = now
            self._done = 0
