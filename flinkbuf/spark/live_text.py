"""The live view in a terminal (``flinkbuf monitor URL``): the view's JSON
fetched every interval and drawn as text, in place on a terminal (one
frame after another otherwise): :func:`watch`, over :func:`view_url`,
:func:`fetch` and :func:`render`."""

import json
import math
import os
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from flinkbuf.errors import RemoteConnectionError
from flinkbuf.spark._live_store import LEVEL_COLOURS

MAX_DOCUMENT = 32 << 20        # bytes of JSON a view may send
_LEVEL_RGB = {level: tuple(bytes.fromhex(hex_colour[1:]))
              for level, hex_colour in LEVEL_COLOURS.items()}
_CLEAR = "\x1b[H\x1b[J"

__all__ = ["fetch", "render", "view_url", "watch"]


def view_url(text):
    """The page's URL for ``text`` (``http://HOST:PORT/``, with or without
    the scheme and the slash, or the URL of one of the view's pages);
    ValueError if it cannot be one."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("URL must be the live view's address, http://HOST:PORT/")
    text = text.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme != "http":
        raise ValueError(f"URL must start with http:// (the live view serves plain HTTP; "
                         f"reach a remote driver through a tunnel such as ssh -L), got "
                         f"{text!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"URL has no valid port: {text!r}") from None
    if not parts.hostname:
        raise ValueError(f"URL has no host: {text!r}")
    path = parts.path
    for page in ("/api/view", "/metrics", "/index.html", "/live.js"):
        if path.endswith(page):
            path = path[:-len(page)]
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host if port is None else f"{host}:{port}"
    return urllib.parse.urlunsplit(("http", netloc, path.rstrip("/") + "/", "", ""))


def fetch(url, timeout):
    """The view's JSON document from page URL ``url`` (see :func:`view_url`)
    within ``timeout`` seconds; RemoteConnectionError saying why not."""
    api = url + "api/view"
    try:
        with urllib.request.urlopen(api, timeout=timeout) as response:
            body = response.read(MAX_DOCUMENT + 1)
    except urllib.error.HTTPError as exc:
        detail = exc.read(300).decode("utf-8", "replace").strip()
        raise RemoteConnectionError(f"the live view at {url} answered HTTP {exc.code}"
                                    + (f": {detail}" if detail else "")) from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        raise RemoteConnectionError(f"cannot reach the live view at {url}: "
                                    f"{getattr(reason, 'strerror', None) or reason}") from None
    except (OSError, ValueError) as exc:
        raise RemoteConnectionError(f"cannot reach the live view at {url}: {exc}") from None
    if len(body) > MAX_DOCUMENT:
        raise RemoteConnectionError(f"{api} sent more than {MAX_DOCUMENT} bytes")
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        doc = None
    if not (isinstance(doc, dict) and doc.get("flinkbuf_live_view") == 1
            and isinstance(doc.get("exchanges"), list)):
        raise RemoteConnectionError(f"{url} is not a flinkbuf live view (its api/view is not "
                                    f"the view's JSON)")
    return doc


def _num(x):
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        return "-"
    for above, scale, suffix in ((1e9, 1e9, " G"), (1e6, 1e6, " M"), (1e4, 1e3, " k")):
        if abs(x) >= above:
            return f"{x / scale:.1f}{suffix}"
    return f"{x:.0f}"


def _pct(x):
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        return "-"
    return f"{100 * x:.0f} %"


def _level(level, colour):
    text = f"{level:<4}"
    if colour and level in _LEVEL_RGB:
        r, g, b = _LEVEL_RGB[level]
        return f"\x1b[1;38;2;255;255;255;48;2;{r};{g};{b}m{text}\x1b[0m"
    return text


_COLUMNS = (("task", 6), ("attempt", 8), ("state", 9), ("level", 5), ("bp ms/s", 8),
            ("soft", 5), ("hard", 5), ("p busy", 6), ("p idle", 6), ("c busy", 6),
            ("c idle", 6), ("rec in/s", 9), ("rec out/s", 9), ("B in/s", 8), ("B out/s", 8),
            ("outPool", 7), ("inPool", 7), ("excl", 5), ("float", 5), ("buf B", 7),
            ("ttc ms", 7))


def _clip(text, width):
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def render(doc, url="", *, colour=False, width=None):
    """The text of one frame for the view's JSON document ``doc``."""
    width = width or 200
    lines = [_clip(f"flinkbuf live view {url} · reports every {doc.get('interval', '?')} s · "
                   f"{len(doc['exchanges'])} exchange"
                   f"{'' if len(doc['exchanges']) == 1 else 's'}", width)]
    if not doc["exchanges"]:
        lines.append("no exchange reports to this view yet")
    header = " ".join(f"{name:>{w}}" for name, w in _COLUMNS)
    for exchange in doc["exchanges"]:
        if not isinstance(exchange, dict):
            continue
        lines.append("")
        lines.append(_clip(f"{exchange.get('name')}  {exchange.get('state')}  "
                           f"({exchange.get('id')}, {exchange.get('num_tasks')} tasks)", width))
        named = exchange.get("bottleneck") or []
        if named:
            tasks = ", ".join(str(b.get("task")) for b in named)
            lines.append(_clip(f"  bottleneck: task{'s' if len(named) > 1 else ''} {tasks} — "
                               f"{named[0].get('why')}", width))
        elif exchange.get("state") == "RUNNING":
            lines.append("  no bottleneck: no task is busy while the tasks feeding it are "
                         "backpressured")
        lines.append(_clip("  " + header, width))
        for t in exchange.get("tasks") or []:
            if not isinstance(t, dict) or not t.get("latest"):
                continue
            m = t.get("metrics") or {}
            mark = "*" if t.get("bottleneck") else " "
            level = m.get("backPressureLevel", "")
            cells = [f"{mark}{t.get('task')!s:>5}", f"{t.get('attempt')!s:>8}",
                     f"{t.get('state')!s:>9}", None,
                     f"{_num(m.get('backPressuredTimeMsPerSecond')):>8}",
                     f"{_num(m.get('softBackPressuredTimeMsPerSecond')):>5}",
                     f"{_num(m.get('hardBackPressuredTimeMsPerSecond')):>5}",
                     f"{_num(m.get('producerBusyTimeMsPerSecond')):>6}",
                     f"{_num(m.get('producerIdleTimeMsPerSecond')):>6}",
                     f"{_num(m.get('consumerBusyTimeMsPerSecond')):>6}",
                     f"{_num(m.get('consumerIdleTimeMsPerSecond')):>6}",
                     f"{_num(m.get('numRecordsInPerSecond')):>9}",
                     f"{_num(m.get('numRecordsOutPerSecond')):>9}",
                     f"{_num(m.get('numBytesInPerSecond')):>8}",
                     f"{_num(m.get('numBytesOutPerSecond')):>8}",
                     f"{_pct(m.get('outPoolUsage')):>7}", f"{_pct(m.get('inPoolUsage')):>7}",
                     f"{_pct(m.get('inputExclusiveBuffersUsage')):>5}",
                     f"{_pct(m.get('inputFloatingBuffersUsage')):>5}",
                     f"{_num(m.get('debloatedBufferSize')):>7}",
                     f"{_num(m.get('estimatedTimeToConsumeBuffersMs')):>7}"]
            plain = " ".join(c if c is not None else f"{level:<5}" for c in cells)
            row = " ".join(c if c is not None else _level(level, colour) + " " for c in cells)
            lines.append("  " + (row if colour and len(plain) + 2 <= width
                                 else _clip(plain, width - 2)))
            if t.get("error"):
                lines.append(_clip(f"        {t.get('state')}: {t.get('error')}", width))
    lines.append("")
    lines.append("* bottleneck: its consumer is busy while the tasks feeding it are "
                 "backpressured (level: OK <= 10 % of the time backpressured < LOW <= 50 % "
                 "< HIGH)")
    lines.append("bp = soft + hard (the producer blocked on output); p/c busy and idle: the "
                 "producer's and the consumer's ms/s; buf B, ttc ms: buffer debloating's "
                 "buffer size and time to consume")
    return "\n".join(line if "\x1b" in line else _clip(line, width) for line in lines) + "\n"


def watch(url, *, interval=1.0, count=None, timeout=5.0, out=None):
    """Draw the view at ``url`` every ``interval`` seconds, ``count``
    times (None: until interrupted); in place on a terminal.  Raises
    RemoteConnectionError when the view cannot be reached (at the start,
    or for ``timeout`` seconds later on)."""
    out = out or sys.stdout
    url = view_url(url)
    tty = out.isatty()
    colour = tty and "NO_COLOR" not in os.environ
    frames = 0
    last_ok = None
    while count is None or frames < count:
        started = time.monotonic()
        try:
            doc = fetch(url, timeout)
            last_ok = time.monotonic()
        except RemoteConnectionError as exc:
            if last_ok is None or time.monotonic() - last_ok > timeout:
                if last_ok is not None:
                    raise RemoteConnectionError(f"the live view went away: {exc}") from None
                raise
            time.sleep(min(interval, 0.5))
            continue
        width = shutil.get_terminal_size((200, 50)).columns if tty else None
        frame = render(doc, url, colour=colour, width=width)
        if tty:
            out.write(_CLEAR + frame)
        else:
            out.write(("\n" if frames else "") + frame)
        out.flush()
        frames += 1
        if count is not None and frames >= count:
            break
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
    return frames
