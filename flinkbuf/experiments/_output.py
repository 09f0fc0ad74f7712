"""What both experiments write: a CSV table and a JSON document."""

import csv
import json
import os

# How a check reads in the printed summary (None: the check did not run).
VERDICT = {True: "yes", False: "NO", None: "n/a"}


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
