"""What both experiments write: a CSV table and a JSON document, then a
figure when matplotlib is there."""

import csv
import json
import os
import tempfile

from flinkbuf.experiments.arguments import fail

# How a check reads in the printed summary (None: the check did not run).
VERDICT = {True: "yes", False: "NO", None: "n/a"}

PLOT_HINT = "pip install 'flinkbuf[plot]'"


def prepare_out_dir(out_dir, filenames, *, names=None, param="out_dir", created=None):
    """Make ``out_dir`` a directory that ``filenames`` can be written to,
    creating it (and missing parents) if needed, before anything runs; the
    directories it creates are appended to the list ``created`` if given.

    Raises :class:`ExperimentArgumentError` if it is a file, lies under a
    file, cannot be created or written, or one of ``filenames`` in it is a
    directory; whatever this call created is removed again then."""
    name = (names or {}).get(param, param)
    path = os.fspath(out_dir)
    if not path:
        fail(f"{name} must not be empty")
    if os.path.exists(path) and not os.path.isdir(path):
        fail(f"{name} {path!r} is a file, not a directory")
    missing = []
    parent = os.path.abspath(path)
    while not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        fail(f"{name} {path!r} cannot be a directory: {parent!r} is a file")
    made = []
    try:
        for d in reversed(missing):
            os.mkdir(d)
            made.append(d)
        fd, probe = tempfile.mkstemp(prefix=".flinkbuf-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        remove_empty(made)
        fail(f"{name} {path!r} cannot be {'created' if missing else 'written'}: "
             f"{exc.strerror or exc}")
    for filename in filenames:
        target = os.path.join(path, filename)
        problem = None
        if os.path.lexists(target) and not os.path.isfile(target):
            problem = "is not a file"
        elif os.path.isfile(target) and not os.access(target, os.W_OK):
            problem = "cannot be written"
        if problem:
            remove_empty(made)
            fail(f"{name} {path!r}: {filename} in it {problem}")
    if created is not None:
        created.extend(made)
    return path


def remove_empty(directories):
    """Remove those of ``directories`` (made in this order, parents first)
    that are still empty."""
    for d in reversed(directories):
        try:
            os.rmdir(d)
        except OSError:
            pass


def write_table_and_doc(out_dir, name, columns, rows, doc):
    """``out_dir/name.csv`` (``columns`` of each row dict, in order) and
    ``out_dir/name.json`` (``doc``)."""
    with open(os.path.join(out_dir, f"{name}.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow([r[c] for c in columns])
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(doc, f, indent=2)


def load_plotting(printer):
    """The plotting module, or None (after printing how to get the figure)
    when matplotlib cannot be imported."""
    try:
        from flinkbuf.experiments import plotting
    except ImportError:
        printer(f"no figure: matplotlib is not installed; for the PNG, {PLOT_HINT}")
        return None
    return plotting
