"""Take the README's picture of the live view: run the Spark demo, and while
its consumers are slowed (the second phase), load the page the driver
serves in headless Chromium and save a screenshot.

    python scripts/live_view_screenshot.py docs/live-view.png

Needs what the demo needs (PySpark, Java) and Chromium (Debian's chromium
package; or set FLINKBUF_CHROMIUM).  Exits with 1 if the demo did not show
the slowed phase with its producers HIGH, or Chromium failed.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_URL = re.compile(r"^live view: (http://\S+)")
# A row of the demo's table: t, limits P/C, producers %, consumers %, level, ...
_ROW = re.compile(r"^\s*([\d.]+)\s+(\d+)/(\d+)\s+[\d.]+%\s+[\d.]+%\s+(OK|LOW|HIGH)\b")
SLOWED_ROWS = 5              # rows of the slowed phase before the picture (its chart)


def _chromium():
    for name in (os.environ.get("FLINKBUF_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    sys.exit("no Chromium: apt-get install chromium, or set FLINKBUF_CHROMIUM")


def main(argv):
    if len(argv) != 1:
        sys.exit(__doc__.strip().splitlines()[3].strip())
    png = os.path.abspath(argv[0])
    browser = _chromium()
    out = tempfile.mkdtemp(prefix="flinkbuf-live-view-")
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    demo = subprocess.Popen([sys.executable, "-m", "flinkbuf", "spark-demo", "--out", out,
                             "--no-plot", "--records", "200000"],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    url, slowed, taken = None, 0, False
    watchdog = threading.Timer(600, demo.kill)
    watchdog.start()
    try:
        for line in demo.stdout:
            sys.stdout.write(line)
            m = _URL.match(line)
            if m:
                url = m.group(1)
            row = _ROW.match(line)
            if row and not taken and (row.group(2), row.group(3)) == ("60", "30") \
                    and row.group(4) == "HIGH":
                slowed += 1
                if slowed == SLOWED_ROWS and url is not None:
                    with tempfile.TemporaryDirectory() as profile:
                        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                                        "--hide-scrollbars", f"--user-data-dir={profile}",
                                        "--window-size=1400,760", "--virtual-time-budget=2500",
                                        f"--screenshot={png}", url],
                                       check=True, timeout=120, capture_output=True)
                    taken = True
                    print(f"screenshot of {url} saved to {png}", flush=True)
        demo.wait()
    finally:
        watchdog.cancel()
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        shutil.rmtree(out, ignore_errors=True)
    if not taken:
        sys.exit("the demo ended without a slowed phase whose producers were HIGH: no "
                 "screenshot")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
