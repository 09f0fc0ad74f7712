"""``python -m flinkbuf``: see :mod:`flinkbuf.cli`."""

import sys

from flinkbuf.cli import main

if __name__ == "__main__":
    sys.exit(main())
