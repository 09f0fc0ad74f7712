"""One line for an error that ended a run: what the command line prints
instead of a traceback."""

import re

from flinkbuf.errors import FlinkbufError

_TRACEBACK = "Traceback (most recent call last):"
_JAVA_CLASS = re.compile(r"^(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*)(?=:|$)")
_CHAIN_LINES = ("During handling of the above exception", "The above exception was the direct")


class RunFailed(FlinkbufError, RuntimeError):
    """A run could not go on (a task failed, Spark did not start): the
    message says why in one line, its cause included; the cause itself is
    chained (:meth:`because`)."""

    @classmethod
    def because(cls, what, cause, hint=None):
        """``what`` happened, because of ``cause`` (an exception: its root
        cause in one line), and ``hint`` (where to read more) if given."""
        exc = cls(f"{what}: {describe(cause)}" + (f" ({hint})" if hint else ""))
        exc.__cause__ = cause
        return exc


def root_cause(exc):
    """The last exception of ``exc``'s chain of causes (``raise ... from``),
    or of the exceptions it was raised while handling."""
    seen = {id(exc)}
    while True:
        nxt = exc.__cause__
        if nxt is None and not exc.__suppress_context__:
            nxt = exc.__context__
        if nxt is None or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        exc = nxt


def _short_java(line):
    """``org.apache.spark.SparkException: ...`` -> ``SparkException: ...``."""
    return _JAVA_CLASS.sub(r"\1", line.strip(), count=1)


def _python_error_in(text):
    """The exception line of the last Python traceback quoted in ``text``
    (the error of a Spark task's Python code), or None."""
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return None
    found = None
    for line in text[start + len(_TRACEBACK):].splitlines():
        if line.startswith("\tat ") or line.startswith("\t..."):
            break                                   # the Java stack trace begins
        if line and not line[0].isspace() and not line.startswith(_CHAIN_LINES) \
                and line != _TRACEBACK:
            found = line.strip()
    return found


_JAVA_HEADER = re.compile(r"^(?:Caused by: )?(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?::|$)")


def _java_error_in(text):
    """The most telling line of a Java exception's text (a Py4JJavaError's):
    what a Python worker printed when it failed to start, else the root
    cause (the last ``Caused by:``), else the last exception named before
    the stack trace (a failed task's, inside Spark's "Job aborted"), else
    the first line."""
    lines = text.splitlines()
    java = [ln[2:] for ln in lines if ln.startswith(": ")]
    for i, line in enumerate(lines):
        if line.strip() == "Error from python worker:":
            said = next((ln.strip() for ln in lines[i + 1:] if ln.strip()), "")
            if said and lines[i + 1:] and lines[i + 1][:1].isspace():
                return f"a Python worker did not start: {said}"
    caused = [ln[len("Caused by: "):] for ln in lines if ln.startswith("Caused by: ")]
    if caused:
        return _short_java(caused[-1])
    headers = []
    for line in lines:
        if line.startswith("\tat "):
            break
        if _JAVA_HEADER.match(line.strip()) and line.strip().split(":", 1)[1:] != [""]:
            headers.append(line.strip())
    if headers:
        return _short_java(headers[-1])
    return _short_java(java[0] if java else (lines[0] if lines else ""))


def describe(exc):
    """One line for ``exc``: its root cause's type and message; for an
    error raised in the JVM (a Spark job's), the telling line of the Java
    exception, or the Python error a task raised."""
    root = root_cause(exc)
    text = str(root)
    if isinstance(root, RunFailed):
        return " ".join(text.split())
    python = _python_error_in(text)
    if python:
        return f"{python} (raised in a Spark task)"
    if hasattr(root, "java_exception"):             # py4j.protocol.Py4JJavaError
        return _java_error_in(text)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    name = type(root).__name__
    return f"{name}: {first}" if first else name


def one_line(exc):
    """``exc``'s own message, followed by its root cause (:func:`describe`)
    when that is another exception."""
    if isinstance(exc, RunFailed):
        return " ".join(str(exc).split())
    root = root_cause(exc)
    if root is exc:
        return describe(exc)
    own = " ".join(str(exc).split())
    return f"{own}: {describe(exc)}" if own else describe(exc)
