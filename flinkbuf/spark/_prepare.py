"""What the driver does for an exchange before its stage runs, the same for
both exchanges (:func:`~flinkbuf.spark.pipelined_exchange` over an RDD,
:func:`~flinkbuf.spark.arrow_exchange` over a DataFrame): :func:`prepare`
makes the spec its tasks run with and starts what serves them, and
:meth:`Prepared.launch` builds the stage and ties the rendezvous's
lifetime to the result.
"""

import weakref

from flinkbuf.spark import _descriptors, _rendezvous, live
from flinkbuf.spark._spec import make_spec, new_exchange_id, new_secret
from flinkbuf.spark.driver import session_encryption, session_port_retries


class Prepared:
    """An exchange made ready on the driver: the ``spec`` its tasks run with
    and the ``server`` of its rendezvous (None: the tasks use
    ``allGather``)."""

    def __init__(self, spec, server):
        self.spec = spec
        self.server = server

    def launch(self, build, owner=None):
        """``build()``, the exchange's stage (which holds the tasks' spec),
        returned; the rendezvous serves while ``owner`` (default: the
        returned object) lives, then until no task has registered for the
        rendezvous bound; if ``build`` fails, it closes at once."""
        try:
            result = build()
        except BaseException:
            if self.server is not None:
                self.server.close()
            raise
        serve_while(self.server, result if owner is None else owner)
        return result


def prepare(session, num_tasks, options, live_view, name):
    """Make an exchange of ``num_tasks`` tasks ready on the driver of
    ``session`` (a :mod:`~flinkbuf.spark._session` of either kind), in
    order: the session's defaults for the checked ``options``
    (``encryption``, ``port_retries``), the ``live_view=`` option
    checked, the master's slots checked (waiting up to the ``slots``
    bound on a classic cluster), the exchange's secret and id made, its
    tasks' reports attached to the live view (``name``: what the view
    calls the exchange), the driver's rendezvous started (with the
    ``"driver"`` rendezvous: on a Connect session, this client's) and the
    exchange's stage watched for lacking slots: the spec, made once, and
    the server."""
    encryption = session_encryption(session.key, options.encryption)
    port_retries = session_port_retries(session.key, options.port_retries)
    live.check_option(live_view)
    session.check_slots(num_tasks, options.timeouts.slots)
    secret, exchange_id = new_secret(), new_exchange_id()
    target = live.attach(session, live_view, exchange_id, num_tasks, name)
    server = None
    if options.rendezvous == "driver":
        server = start_rendezvous(session, secret, num_tasks, options, port_retries)
    if session.connect or server is not None:
        session.watch(server, num_tasks, options.timeouts.slots, exchange_id)
    spec = make_spec(options, secret=secret, exchange_id=exchange_id, encryption=encryption,
                     port_retries=port_retries,
                     rendezvous=None if server is None else server.address, live=target)
    return Prepared(spec, server)


def start_rendezvous(session, secret, num_tasks, options, port_retries):
    """The driver's rendezvous of an exchange (on ``spark.driver.host``, or
    this Connect client's address, at ``rendezvous_port`` or one of the
    next ``port_retries``), with room for a descriptor per connection it
    may hold."""
    bind, advertised = session.addresses()
    connections, unauthenticated, _ = _rendezvous.budgets(num_tasks)
    _descriptors.make_room(connections + unauthenticated,
                           f"the driver's rendezvous of a {num_tasks}-task exchange")
    timeouts = options.timeouts
    return _rendezvous.RendezvousServer(secret, num_tasks, host=bind, advertise=advertised,
                                        timeout=timeouts.rendezvous,
                                        issued_task_ids=session.issued_task_ids(),
                                        port=options.rendezvous_port,
                                        port_retries=port_retries)


def serve_while(server, owner):
    """Keep ``server`` up while ``owner`` lives; once it is garbage
    collected, until no task has registered for the rendezvous bound.
    :func:`~flinkbuf.spark.close_rendezvous` and the interpreter's exit
    close it at once."""
    if server is not None:
        weakref.finalize(owner, server.release).atexit = False
