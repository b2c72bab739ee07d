"""``python -m pyrunner``: see pyrunner.cli."""

import sys

from pyrunner.cli import main

if __name__ == "__main__":
    sys.exit(main())
