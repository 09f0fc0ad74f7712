"""Prometheus's text exposition format (version 0.0.4), as the live view's
``/metrics`` serves it: one ``# HELP`` and one ``# TYPE`` line per metric
family, then a line per sample, ``name{label="value",...} number``."""

import math
import re

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TYPES = ("counter", "gauge", "untyped")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def escape_label_value(value):
    """A label value as it goes between double quotes: backslash, double
    quote and line feed escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text):
    """A HELP text: backslash and line feed escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value):
    """A sample's number: an integer as such, a float in Python's shortest
    repr, ``NaN``, ``+Inf`` or ``-Inf``."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def format_families(families):
    """The exposition of ``families``: each ``(name, type, help, samples)``
    with samples ``(labels, value)``, labels a dict of str.  Raises
    ValueError for a name, a label name or a type that the format does
    not allow, or a name given twice."""
    lines = []
    seen = set()
    for name, kind, help_text, samples in families:
        if not _NAME.match(name) or name in seen:
            raise ValueError(f"metric name {name!r} is invalid or repeated")
        if kind not in TYPES:
            raise ValueError(f"metric type {kind!r} (one of {', '.join(TYPES)})")
        seen.add(name)
        lines.append(f"# HELP {name} {escape_help(help_text)}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            parts = []
            for label, text in labels.items():
                if not _LABEL.match(label) or label.startswith("__"):
                    raise ValueError(f"label name {label!r} is invalid")
                parts.append(f'{label}="{escape_label_value(str(text))}"')
            body = "{" + ",".join(parts) + "}" if parts else ""
            lines.append(f"{name}{body} {format_value(value)}")
    return "\n".join(lines) + "\n" if lines else ""
