"""A remote channel's credit (csrc/network/credit.h) against a model of the
sender: the pure bookkeeping a connection runs under its lock, driven with
no connection, so every sequence of holds, announcements, arrivals, events
and releases is reachable."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from flinkbuf._testing import CREDIT_ACTIONS, CREDIT_EVENT_WINDOW, CreditModel, WaitlistModel


class CreditMachine(RuleBasedStateMachine):
    """The receiver's credit against the sender's view of it: the sender
    only ever sends with credit it was told of, and then every buffer finds
    a held segment; credit held is never lost, never announced twice."""

    def __init__(self):
        super().__init__()
        self.cap = 8
        self.cr = CreditModel(self.cap)
        self.held = []               # (index, floating), as the channel holds them
        self.next_index = 0
        self.requested = False
        self.sender_credit = 0       # credit the sender was told of and has not used
        self.events_sent = 0
        self.events_window = CREDIT_EVENT_WINDOW
        self.events_taken = 0
        self.taken_since_grant = 0
        self.released = False

    def _index(self):
        self.next_index += 1
        return self.next_index

    @precondition(lambda self: not self.requested)
    @rule()
    def add_exclusive(self):
        index = self._index()
        added = self.cr.add_exclusive(index)
        assert added == (len(self.held) < self.cap)
        if added:
            self.held.append((index, False))

    @precondition(lambda self: not self.requested and not self.released)
    @rule()
    def write_request(self):
        self.sender_credit = self.cr.take_initial()
        assert self.sender_credit == len(self.held)
        self.requested = True

    @precondition(lambda self: not self.released)
    @rule(floating=st.booleans(), open_=st.booleans(), consumer_reads=st.booleans())
    def hold_and_announce(self, floating, open_, consumer_reads):
        index = self._index()
        before = self.cr.state
        kept = self.cr.hold(index, floating)
        assert kept == (len(self.held) < self.cap)
        if not kept:
            return
        self.held.append((index, floating))
        action = CREDIT_ACTIONS[self.cr.announce(open_ and self.requested, consumer_reads)]
        after = self.cr.state
        if action in ("send", "batch", "defer"):
            assert not before["queued"] and after["queued"]
        if action == "defer":
            assert consumer_reads and after["deferred"]
        if action == "send_queued":
            assert before["deferred"] and not after["deferred"]
        if open_ and self.requested:
            assert after["queued"], "credit held with nothing queued to announce it"

    @precondition(lambda self: self.cr.state["queued"])
    @rule(lost=st.booleans())
    def write_credit(self, lost):
        """The writer writes the queued ADD_CREDIT (or it could not be queued)."""
        if lost:
            self.cr.unqueue()
            assert not self.cr.state["queued"]
            return
        unannounced = self.cr.state["unannounced"]
        n = self.cr.take_announcement()
        assert n == unannounced
        self.sender_credit += n
        assert not self.cr.state["queued"] and not self.cr.state["deferred"]

    @precondition(lambda self: self.sender_credit > 0)
    @rule()
    def buffer_arrives(self):
        got = self.cr.consume()
        assert got == self.held.pop(), "a buffer the sender had credit for found no segment"
        self.sender_credit -= 1

    @rule()
    def buffer_without_credit(self):
        if self.cr.state["nheld"] == 0:
            assert self.cr.consume() is None

    @precondition(lambda self: self.events_sent < self.events_window)
    @rule()
    def event_arrives(self):
        assert self.cr.event_arrives()
        self.events_sent += 1

    @precondition(lambda self: self.events_sent == self.events_window)
    @rule()
    def event_beyond_window(self):
        assert not self.cr.event_arrives()

    @precondition(lambda self: self.events_taken < self.events_sent)
    @rule(open_=st.booleans())
    def event_taken(self, open_):
        queued = self.cr.state["event_queued"]
        action = CREDIT_ACTIONS[self.cr.event_taken(open_)]
        self.events_taken += 1
        self.taken_since_grant += 1
        assert action == ("send" if open_ and not queued else "nothing")

    @precondition(lambda self: self.cr.state["event_queued"])
    @rule()
    def write_event_credit(self):
        granted = self.cr.take_event_grant(True)
        assert granted == self.taken_since_grant
        self.taken_since_grant = 0
        self.events_window += granted
        assert self.events_window == self.cr.state["events_granted"]
        assert not self.cr.state["event_queued"] and self.cr.state["events_taken"] == 0

    @rule(backlog=st.integers(0, 40))
    def need(self, backlog):
        s = self.cr.state
        want = max(0, min(backlog + s["num_exclusive"] - len(self.held), self.cap - len(self.held)))
        assert self.cr.need(backlog) == want

    @rule()
    def release_all(self):
        assert self.cr.release_all() == self.held
        self.held = []
        self.sender_credit = 0
        self.released = True
        assert self.cr.state["nheld"] == 0 and self.cr.state["unannounced"] == 0

    @invariant()
    def credit_told_is_credit_held(self):
        s = self.cr.state
        assert s["nheld"] == len(self.held) <= self.cap
        exclusive, floating = self.cr.counts()
        assert floating == sum(f for _, f in self.held) and exclusive + floating == len(self.held)
        if self.requested and not self.released:
            assert self.sender_credit == s["nheld"] - s["unannounced"]
        assert s["events_received"] == self.events_sent <= s["events_granted"]


# Cheap (no I/O): more runs than the profile's default, so that long
# sequences (a channel full after its request) are reached every time.
MACHINE_SETTINGS = settings(max_examples=max(400, settings().max_examples),
                            stateful_step_count=60)
TestCredit = CreditMachine.TestCase
TestCredit.settings = MACHINE_SETTINGS


class WaitlistMachine(RuleBasedStateMachine):
    """A gate's waiting list: first come, first served, one want fewer per
    segment, off the list when it wants no more."""

    def __init__(self):
        super().__init__()
        self.wl = WaitlistModel()
        self.channels = [CreditModel(4) for _ in range(4)]
        self.order = []              # channel numbers, oldest first
        self.wants = [0] * 4

    @rule(k=st.integers(0, 3), need=st.integers(1, 5))
    def want(self, k, need):
        self.wl.want(self.channels[k], need)
        if self.wants[k] == 0:
            self.order.append(k)
        self.wants[k] = max(self.wants[k], need)

    @rule()
    def segment_back(self):
        got = self.wl.pop()
        if not self.order:
            assert got is None
            return
        k = self.order[0]
        assert got is self.channels[k]
        self.wants[k] -= 1
        if self.wants[k] == 0:
            self.order.pop(0)

    @rule(k=st.integers(0, 3))
    def took_from_pool(self, k):
        assert self.wl.took(self.channels[k]) == (self.wants[k] > 0)
        if self.wants[k] > 0:
            self.wants[k] -= 1
            if self.wants[k] == 0:
                self.order.remove(k)

    @rule(k=st.integers(0, 3))
    def remove(self, k):
        self.wl.remove(self.channels[k])
        self.wants[k] = 0
        if k in self.order:
            self.order.remove(k)

    @invariant()
    def matches(self):
        assert len(self.wl) == len(self.order)
        assert [c.state["wants"] for c in self.channels] == self.wants


TestWaitlist = WaitlistMachine.TestCase
TestWaitlist.settings = MACHINE_SETTINGS


def test_a_deferred_credit_goes_out_once_the_sender_runs_short():
    """Deferred for the consumer's next read while the sender has plenty;
    once arrivals leave it knowing of at most one segment, the next hold
    asks for the queued credit to go now."""
    cr = CreditModel(8)
    for index in range(4):
        assert cr.add_exclusive(index)
    assert cr.take_initial() == 4
    assert cr.consume() is not None and cr.consume() is not None   # the sender knows of 2
    assert CREDIT_ACTIONS[cr.hold(10, False) and cr.announce(True, True)] == "defer"
    assert cr.consume() is not None                                  # it knows of 1
    assert CREDIT_ACTIONS[cr.hold(11, True) and cr.announce(True, True)] == "send_queued"
    assert cr.take_announcement() == 2


@pytest.mark.parametrize("cap", [0, -1, 2**20 + 1])
def test_a_bad_capacity_is_refused(cap):
    with pytest.raises(ValueError):
        CreditModel(cap)
