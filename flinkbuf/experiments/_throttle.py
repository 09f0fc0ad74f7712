"""Holding a task's loop to a percentage of its full speed (the blog's
``Thread.sleep()`` slow-downs), without bursts after a stall."""

import time


class Throttle:
    """Paces one task's loop: the task calls :meth:`pace` with the number
    of records done since its last call, and it sleeps whenever the loop is
    ahead of ``limit_pct`` percent of ``full_rate`` records/s.  With
    ``full_rate=None`` it never sleeps (the loop's own speed).

    A loop that falls behind its schedule catches up, but by at most
    ``max_lag`` seconds of records: further behind (a backpressured or
    descheduled task) the schedule restarts from now, so a task released
    from backpressure does not burst.  :meth:`set_limit` may be called from
    any thread; only the task calls :meth:`pace`."""

    def __init__(self, full_rate=None, limit_pct=100.0, max_lag=0.1):
        self.max_lag = max_lag
        self._full_rate = None
        self._seen = None
        self.set_limit(limit_pct, full_rate)

    @property
    def limit_pct(self):
        return self._limit

    @property
    def full_rate(self):
        return self._full_rate

    def set_limit(self, pct, full_rate=None):
        """Pace at ``pct`` % of ``full_rate`` (None: keep the current one);
        the schedule restarts from now."""
        if not pct > 0:
            raise ValueError(f"limit must be > 0 %, got {pct}")
        if full_rate is not None:
            if not full_rate > 0:
                raise ValueError(f"full rate must be > 0 records/s, got {full_rate}")
            self._full_rate = float(full_rate)
        self._limit = float(pct)
        rate = None if self._full_rate is None else self._full_rate * self._limit / 100.0
        # Posted as one new object: the task adopts it whole at its next pace().
        self._posted = (rate, time.perf_counter())

    def unthrottle(self):
        """From now on the loop runs at its own speed."""
        self._full_rate = None
        self._limit = 100.0
        self._posted = (None, time.perf_counter())

    def pace(self, n):
        posted = self._posted
        if posted is not self._seen:
            self._seen = posted
            self._rate, self._origin = posted
            self._done = 0
        if self._rate is None:
            return
        self._done += n
        now = time.perf_counter()
        due = self._origin + self._done / self._rate
        if due > now:
            time.sleep(due - now)
        elif now - due > self.max_lag:
            self._origin = now
            self._done = 0
