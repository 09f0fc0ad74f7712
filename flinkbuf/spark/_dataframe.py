"""The DataFrame an exchange runs over, on a session of either kind
(:func:`exchange_input`): its session and the number of its tasks, one per
partition of the DataFrame as its plan makes it, or ``num_partitions``
after a repartitioning."""

from flinkbuf.checks import check_int
from flinkbuf.spark._session import ClassicSession, ConnectSession, is_connect, master_slots

# Spark Connect's plan nodes that keep their input's partitions.
_NARROW = frozenset(("Project", "Filter", "WithColumns", "WithColumnsRenamed", "Drop",
                     "SubqueryAlias", "Hint", "ToDF", "Sample", "WithWatermark",
                     "CachedRelation", "Alias"))


def exchange_input(df, num_partitions):
    """``(session, df, n)``: the session of DataFrame ``df``, the
    DataFrame the exchange's stage runs over (``df`` repartitioned to
    ``num_partitions`` when given) and its number of partitions.  On
    Spark Connect, without ``num_partitions``, the number comes from the
    client's plan (a range of a given number of partitions, a
    repartitioning to a number, and what keeps their partitions); a plan
    that does not tell raises ValueError asking for ``num_partitions``."""
    if num_partitions is not None:
        check_int(num_partitions, "num_partitions", 1)
    connect = is_connect(df)
    session = ConnectSession(df.sparkSession) if connect else \
        ClassicSession(df.sparkSession.sparkContext)
    if num_partitions is not None:
        return session, df.repartition(num_partitions), num_partitions
    if not connect:
        return session, df, df.rdd.getNumPartitions()
    n = plan_partitions(df._plan, session)
    if n is None:
        raise ValueError(
            "on a Spark Connect session the number of the exchange's tasks comes from the "
            "DataFrame's plan, and this one does not fix it (it is known for a range with "
            "numPartitions and after repartition(n)): give num_partitions=N (the exchange "
            "repartitions the DataFrame to N partitions first)")
    return session, df, n


def plan_partitions(plan, session):
    """The partitions of Spark Connect ``plan`` where the client's plan
    fixes them, else None."""
    while plan is not None:
        kind = type(plan).__name__
        if kind == "Range":
            n = plan._num_partitions
            return n if n is not None else _default_parallelism(session)
        if kind in ("Repartition", "RepartitionByExpression"):
            n = getattr(plan, "_num_partitions", None)
            if n is None:
                n = getattr(plan, "num_partitions", None)
            shuffle = getattr(plan, "_shuffle", True)
            return n if n and shuffle else None
        if kind not in _NARROW and not (kind == "MapPartitions"
                                         and not getattr(plan, "_is_barrier", False)):
            return None
        plan = getattr(plan, "_child", None)
    return None


def _default_parallelism(session):
    """A leaf's partitions by default, where the settings tell."""
    conf = session.conf
    for key in ("spark.sql.leafNodeDefaultParallelism", "spark.default.parallelism"):
        value = conf.get(key, None)
        if value and str(value).strip().isdigit():
            return int(str(value).strip())
    return master_slots(session.master, {}, session.cpus()) \
        if session.master.startswith("local") else None
